"""`jaxpos analyze`: run workdirs and Hugging Face folders load, every diagnostic lands in report.json with numbers
that agree with direct calls, figures are written, and bad inputs fail with messages that name the file."""

import collections
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.analysis.loading import load_hf, load_run
from jaxpos.data.wordpiece import WordPiece
from jaxpos.analysis.report import analyze, corpus_sentences, token_windows
from jaxpos.cli.analyze import summary
from jaxpos.config import model_config
from jaxpos.config.defaults import mlm_config
from jaxpos.data.corpus import embedded_documents
from jaxpos.data.mlm import split_sentences
from jaxpos.data.tokenizer import train_sentencepiece
from jaxpos.models import BertForMaskedLM
from jaxpos.training.checkpoint import Checkpointer
from jaxpos.training.optim import make_optimizer
from jaxpos.training.state import init_state

TINY_MODEL = dict(d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=32, dropout=0.0,
                  attention_dropout=0.0)  # head dim D = 8
FAST = dict(num_probe_words=6, probe_length=16, lengths=(8, 16), windows=2, probe_epochs=4, probe_patience=2,
            probe_learning_rate=3e-3, attribution_windows=1, attribution_length=10)


@pytest.fixture(scope="module")
def texts():
    return embedded_documents()[:40]


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory, texts):
    prefix = str(tmp_path_factory.mktemp("spm") / "spm_mlm")
    return train_sentencepiece((s for d in texts for s in split_sentences(d)), prefix, 300)


def save_run(workdir, tokenizer, position: dict, step: int = 3):
    """A workdir as `jaxpos train` leaves it: config.json, the tokenizer, orbax checkpoints of the TrainState."""
    os.makedirs(workdir, exist_ok=True)
    for suffix in (".model", ".vocab"):
        with open(tokenizer.path[:-len(".model")] + suffix, "rb") as src, \
                open(os.path.join(workdir, "spm_mlm" + suffix), "wb") as dst:
            dst.write(src.read())
    config = mlm_config()
    config.model.update(vocab_size=tokenizer.vocab_size, **TINY_MODEL)
    config.model.position.update(position)
    config.data.seq_len = 16
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2))
    ids = jnp.zeros((1, 16), jnp.int32)
    init = jax.jit(lambda key: nn.unbox(init_state(BertForMaskedLM(model_config(config.model)),
                                                   make_optimizer(config.train), key, (ids,),
                                                   dict(piece_ids=jnp.ones_like(ids)))))
    state = init(jax.random.PRNGKey(step))
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
    checkpointer.save(step, state, {"step": step})
    checkpointer.close()
    return state


def figures_exist(report, out):
    for name, section in report.items():
        if isinstance(section, dict) and "figure" in section:
            assert os.path.getsize(os.path.join(out, section["figure"])) > 1000, name


def test_absolute_run_report_agrees_with_direct_calls(tmp_path, spm_model, texts):
    from jaxpos.analysis.locality import locality, symmetry
    from jaxpos.analysis.probing import identical_word_attention
    from jaxpos.analysis.profile import positional_profile
    from jaxpos.analysis.tisa_fit import profile_rows_to_offsets
    from jaxpos.analysis.toeplitz import position_gram, toeplitz_r2

    state = save_run(tmp_path / "run", spm_model, dict(kind="absolute"))
    model = load_run(str(tmp_path / "run"))
    assert model.info["step"] == 3 and model.cfg.position.kind == "absolute"
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params["bert"]), model.params)
    sentences = corpus_sentences(model, texts, 24)
    assert all(s[0] == 2 and s[-1] == 3 for s in sentences)  # [CLS] ... [SEP]
    out = tmp_path / "out"
    report = analyze(model, str(out), sentences=sentences, **FAST)
    assert report == json.loads((out / "report.json").read_text())
    figures_exist(report, out)

    table = model.params["encoder"]["position"]["embedding"]
    assert report["position_gram"]["toeplitz_r2"] == pytest.approx(toeplitz_r2(position_gram(table)), abs=1e-12)

    probe = report["identical_word"]
    matrix = np.asarray(probe["matrix"])
    assert matrix.shape == (16, 16) and np.allclose(matrix.sum(-1), 1, atol=1e-5)
    assert probe["locality"] == pytest.approx(locality(matrix), abs=1e-12)
    assert probe["symmetry"] == pytest.approx(symmetry(matrix), abs=1e-12)
    for layer, m in enumerate(np.asarray(probe["layer_matrices"])):
        assert probe["layer_locality"][layer] == pytest.approx(locality(m), abs=1e-12)
    words = [model.vocabulary.index(w) for w in probe["words"]]
    direct = identical_word_attention(model.cfg, model.params, words, length=16).mean(axis=(0, 1))
    np.testing.assert_allclose(matrix, direct, atol=1e-6)

    # DIET Theorem 1: input positions keep every head's logits at rank <= D (here D = 8 < T = 16).
    rank = report["rank"]
    assert rank["length"] == 16 and 1 <= rank["logit_rank_max"] <= 8
    assert np.max(rank["positional_input"]["rank"]) <= 8

    fit = report["positional_profile"]
    profile = positional_profile(model.cfg, model.params)
    np.testing.assert_allclose(fit["offset_scores"], profile_rows_to_offsets(profile), atol=1e-12)
    np.testing.assert_array_equal(np.load(out / "arrays.npz")["positional_profile"], profile)
    assert fit["toeplitz_r2"] == pytest.approx(toeplitz_r2(profile).tolist(), abs=1e-12)
    assert len(fit["fit_r2"]) == 4 and all(r <= 1 for r in fit["fit_r2"])
    assert report["tisa_scores"]["skipped"].startswith("position.kind='absolute'")

    importance = np.asarray(report["decomposition"]["importance"])
    assert importance.shape == (3, 4) and np.allclose(importance.sum(axis=1), 1)
    assert report["decomposition"]["max_reconstruction_error"] < 1e-4

    effective = report["effective_attention"]
    assert effective["lengths"] == [8, 16]
    assert effective["correlation"][0] == pytest.approx(1.0, abs=1e-5)  # T <= D: attention is identifiable
    assert effective["correlation"][1] < 1.0
    # The value-output maps T [T, d] have rank min(T, D) at numpy's tolerance for float32: max(T, d) x eps.
    eps = np.finfo(np.float32).eps
    assert rank["rtol"] == 16 * eps and effective["rtol"] == [32 * eps, 32 * eps]  # logits 16 x 16, maps T x 32
    np.testing.assert_array_equal(effective["value_map_rank"], np.full((2, 2, 4), 8.0))
    assert effective["rank_summary"] == ("rank tolerance max(T, d) x float32 eps x the largest singular value of T; "
                                         "T=8: rank 8 of 8 (tolerance 3.81e-06), "
                                         "T=16: rank 8 of 16 (tolerance 3.81e-06)")

    rates = report["identifiability"]["rates"]
    assert rates["naive"][0] == 1.0 and len(rates["linear"]) == 3
    assert all(0 <= r <= 1 for r in rates["linear"])

    shares = report["attribution"]
    assert len(shares["self_share"]) == 2 and len(shares["by_distance"][0]) == 10
    assert all(0 < s <= 1 for s in shares["self_share"])
    assert report["skipped"] == {"tisa_scores": report["tisa_scores"]["skipped"]}

    # The printed summary numbers layers as the figures do: the embedding output, then layer 1 = the first; the
    # identifiability rates (embeddings and 2 layers) and the own-token shares (2 layers) share the columns.
    lines = summary(report).splitlines()
    assert any(line.startswith("  F-hat_P (layer 1): TISA fit r^2 per head ") for line in lines)
    assert any(line.startswith("  Muppet importance at layer 2 (the last; i h f c): ") for line in lines)
    start = next(i for i, line in enumerate(lines) if line.startswith("  layer (1 = first)"))
    table = lines[start:start + 4]
    assert table[0].split()[-3:] == ["embeddings", "1", "2"]
    assert table[1].split() == ["identifiability", "(naive)", *(f"{r:.2f}" for r in rates["naive"])]
    assert table[2].split() == ["identifiability", "(linear)", *(f"{r:.2f}" for r in rates["linear"])]
    assert table[3].split() == ["own-token", "contribution", "-", *(f"{s:.2f}" for s in shares["self_share"])]
    assert len({len(line) for line in table}) == 1  # right-aligned under their headers


def test_tisa_run_skips_what_does_not_apply(tmp_path, spm_model, texts):
    from jaxpos.analysis.rank import numerical_rank
    from jaxpos.analysis.report import bias_logits

    save_run(tmp_path / "run", spm_model, dict(kind="tisa"))
    model = load_run(str(tmp_path / "run"))
    out = tmp_path / "out"
    report = analyze(model, str(out), sentences=corpus_sentences(model, texts, 16),
                     only=["position_gram", "positional_profile", "tisa_scores", "rank"],
                     **FAST)
    assert "no position embeddings at the input" in report["position_gram"]["skipped"]
    assert "needs learned input position embeddings" in report["positional_profile"]["skipped"]
    assert set(report["skipped"]) == {"position_gram", "positional_profile"}
    assert np.asarray(report["tisa_scores"]["kernels"]["a"]).shape == (2, 4, 5)
    ranks = report["rank"]["positional_bias"]["rank"]
    assert ranks == numerical_rank(bias_logits(model.cfg, model.params, 16)).tolist()
    assert report["rank"]["positional_bias"]["toeplitz_r2"][0][0] == pytest.approx(1.0)  # TISA is Toeplitz
    figures_exist(report, out)


def test_deberta_run_skips_position_only_terms_with_the_reason(tmp_path, spm_model, texts):
    save_run(tmp_path / "run", spm_model, dict(kind="deberta", deberta=dict(position_buckets=8,
                                                                           max_relative_positions=12)))
    model = load_run(str(tmp_path / "run"))
    report = analyze(model, str(tmp_path / "out"), sentences=corpus_sentences(model, texts, 16),
                     only=["rank", "decomposition"], **FAST)
    assert report["rank"]["positional"]["skipped"] == (
        "position.kind='deberta' has no position-only logits: DeBERTa's relative terms q_i.K_r and k_j.Q_r are "
        "products with the query's and the key's content")
    assert report["rank"]["logit_rank_max"] >= 1 and "skipped" not in report["decomposition"]


def test_diagnostics_trace_full_precision_products(tmp_path, spm_model, texts, monkeypatch):
    """A GPU's default float32 product (TF32, about 1e-3 relative) is coarser than what the diagnostics compare
    (Muppet's terms sum to the hidden states within 1e-4): the encoder's program traced inside a diagnostic asks
    for full precision in every dot product, and one traced outside keeps the default."""
    from jaxpos.analysis import report as report_module
    from jaxpos.analysis.taps import _encoder_taps

    save_run(tmp_path / "run", spm_model, dict(kind="absolute"))
    model = load_run(str(tmp_path / "run"))
    ids = jnp.zeros((1, 16), jnp.int32)

    def dot_precisions():
        text = _encoder_taps(model.cfg).lower(model.params, ids, jnp.ones_like(ids), None).as_text()
        return {line.split("precision = ")[1].split("]")[0] + "]" for line in text.splitlines()
                if "dot_general" in line}

    traced = {}
    monkeypatch.setitem(report_module._DIAGNOSTIC_FUNCTIONS, "rank",
                        lambda ctx: traced.setdefault("inside", dot_precisions()) and {})
    with jax.default_matmul_precision("default"):  # jax's own default (this suite's conftest asks for highest)
        analyze(model, str(tmp_path / "out"), sentences=corpus_sentences(model, texts, 4), only=["rank"], **FAST)
        outside = dot_precisions()
    assert traced["inside"] == {"[HIGHEST, HIGHEST]"}
    assert "[DEFAULT, DEFAULT]" in outside


def make_hf_folder(path, texts, vocab_size=300):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    words = collections.Counter(w for d in texts for w in WordPiece([], True).words(d))
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [w for w, _ in words.most_common(vocab_size - 5)]
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(vocabulary), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48, max_position_embeddings=32)
    transformers.BertModel(config).save_pretrained(path)
    (path / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    return vocabulary


def test_analyze_into_a_log_prints_no_redraws(tmp_path, spm_model, capsys):
    from jaxpos.cli import main

    save_run(tmp_path / "run", spm_model, dict(kind="absolute"))
    main(["analyze", "--workdir", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--quick",
          "--max-sentences", "12", "--lengths", "8", "--only", "rank,attribution"])
    captured = capsys.readouterr()  # pytest's capture is not a terminal, as `> log 2>&1`
    assert "attention logit rank" in captured.out
    for text in (captured.out, captured.err):
        assert "\r" not in text and "\x1b" not in text, repr(text)


def test_hf_folder_through_the_cli(tmp_path, texts):
    from jaxpos.cli import main

    vocabulary = make_hf_folder(tmp_path / "bert", texts)
    model = load_hf(str(tmp_path / "bert"))
    assert model.vocabulary == vocabulary and (model.cls_id, model.sep_id) == (2, 3)
    ids = model.encode("The value of the attribute.")
    assert ids[0] == 2 and ids[-1] == 3 and 1 not in ids  # common words are whole-word entries
    import transformers

    peer = transformers.BertTokenizer(str(tmp_path / "bert" / "vocab.txt"))
    for text in texts[:80]:  # the WordPiece reimplementation against transformers' own
        assert model.tokenize(text) == peer.encode(text, add_special_tokens=False)
    assert len(token_windows(model, corpus_sentences(model, texts, 10), 12, 3)) == 3

    out = tmp_path / "out"
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(texts[:30]))
    main(["analyze", "--hf", str(tmp_path / "bert"), "--out", str(out), "--quick", "--text", str(text),
          "--probe-words", "6", "--probe-length", "16", "--lengths", "8,16", "--max-sentences", "20",
          "--only", "position_gram,positional_profile,identical_word"])
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["position"] == "absolute" and report["model"]["origin"]["kind"] == "huggingface"
    assert report["identical_word"]["length"] == 16 and all(w in vocabulary for w in report["identical_word"]["words"])
    assert 0 <= report["position_gram"]["toeplitz_r2"] <= 1
    profile = report["positional_profile"]
    assert len(profile["fit_r2"]) == 4 and all(r <= 1 for r in profile["fit_r2"])
    assert np.asarray(profile["kernels"]["a"]).shape == (4, 5)
    figures_exist(report, out)


def test_bad_inputs_name_the_file(tmp_path, spm_model, texts, capsys):
    from jaxpos.cli import main

    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(str(tmp_path / "nowhere"))
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        load_run(str(run))
    (run / "config.json").write_text(json.dumps({"task": "mlm", "model": {"d_modle": 3}}))
    with pytest.raises(ValueError, match="config.json.*unknown config field model.d_modle"):
        load_run(str(run))
    save_run(run, spm_model, dict(kind="absolute"))
    os.remove(run / "spm_mlm.model")
    with pytest.raises(FileNotFoundError, match="spm_mlm.model is missing"):
        load_run(str(run))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((run / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="checkpoints holds no checkpoint"):
        load_run(str(empty))

    hf = tmp_path / "hf"
    hf.mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_hf(str(hf))
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (hf / "tf_model.h5").write_bytes(b"")
    with pytest.raises(ValueError, match="tf_model.h5"):
        load_hf(str(hf))
    pytest.importorskip("transformers")
    make_hf_folder(tmp_path / "bert", texts)
    config_path = tmp_path / "bert" / "config.json"
    config = config_path.read_text()
    config_path.write_text(json.dumps(dict(json.loads(config), model_type="gpt2")))
    with pytest.raises(ValueError, match="config.json.*unsupported Hugging Face model_type 'gpt2'"):
        load_hf(str(tmp_path / "bert"))
    config_path.write_text(config)
    assert main(["analyze", "--hf", str(tmp_path / "bert"), "--text", "missing.txt"]) == 2  # a user error: one line
    assert "jaxpos: error: --text 'missing.txt' does not exist" in capsys.readouterr().err
