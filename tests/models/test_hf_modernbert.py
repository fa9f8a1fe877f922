"""The modern block against Hugging Face's PyTorch ModernBertModel / ModernBertForMaskedLM (peer reference, eager
attention): random models saved with save_pretrained, imported by jaxpos's importer, compared on padded rows longer
than the local window."""

import json
import re
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxpos.checkpoints.huggingface import (bert_encoder_params, bert_mlm_params, bert_pooler_params,  # noqa: E402
                                            config_from_hf, load_hf_checkpoint)
from jaxpos.models import BertEncoder, BertForMaskedLM  # noqa: E402
from tests.models.hf_checks import assert_attention_weights_match, max_error_on_valid_rows  # noqa: E402

# 4 layers, global every 3 (layers 0 and 3), local_attention 8 (4 keys a side): rows of 24 reach past the window.
MODERNBERT = dict(vocab_size=97, hidden_size=32, intermediate_size=40, num_hidden_layers=4, num_attention_heads=4,
                  max_position_embeddings=64, local_attention=8, global_attn_every_n_layers=3, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, initializer_range=0.2,
                  attn_implementation="eager")
BIASES = dict(attention_bias=True, mlp_bias=True, classifier_bias=True, norm_bias=True)


def inputs():
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 97, size=(3, 24))
    attention = np.ones_like(ids)
    attention[1, 18:] = 0
    attention[2, 7:] = 0
    return ids, attention


def randomise(module):
    """LayerNorm scales and biases away from the ones and zeros transformers initialises them to."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.2)


def saved(model_class, tmp_path, **config):
    torch.manual_seed(0)
    hf = model_class(transformers.ModernBertConfig(**{**MODERNBERT, **config})).eval()
    randomise(hf)
    hf.save_pretrained(tmp_path)
    return hf, *load_hf_checkpoint(str(tmp_path))


@pytest.mark.parametrize("config", [{}, BIASES, dict(tie_word_embeddings=False), dict(hidden_activation="silu"),
                                    dict(decoder_bias=False, num_hidden_layers=5, global_attn_every_n_layers=2)],
                         ids=["modernbert_base_block", "biases", "untied", "swiglu", "every_2_no_decoder_bias"])
def test_mlm_logits_match_modernbert_for_masked_lm(config, tmp_path):
    hf, hf_config, state = saved(transformers.ModernBertForMaskedLM, tmp_path, **config)
    cfg = config_from_hf(hf_config)
    assert (cfg.layer_norm, cfg.first_layer_attention_norm, cfg.position.kind) == ("pre", False, "rope")
    assert (cfg.local_window, cfg.position.rope.base, cfg.position.rope.local_base) == (8, 160_000.0, 10_000.0)
    assert cfg.mlp == ("swiglu" if config.get("hidden_activation") == "silu" else "geglu")
    assert [cfg.is_local(i) for i in range(cfg.num_layers)] == [t == "sliding_attention"
                                                               for t in hf.config.layer_types]
    ids, attention = inputs()
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention)).logits.numpy()
    params = bert_mlm_params(state, cfg)
    got = BertForMaskedLM(cfg).apply({"params": params}, jnp.asarray(ids), piece_ids=jnp.asarray(attention))
    assert max_error_on_valid_rows(got, want, attention) < 1e-5
    if not config:  # the window matters at this length: all layers global is far off
        import dataclasses

        global_only = dataclasses.replace(cfg, local_window=None)
        far = BertForMaskedLM(global_only).apply({"params": params}, jnp.asarray(ids),
                                                  piece_ids=jnp.asarray(attention))
        assert max_error_on_valid_rows(far, want, attention) > 1e-2


def test_hidden_states_and_attention_weights_match_modernbert_model(tmp_path):
    hf, hf_config, state = saved(transformers.ModernBertModel, tmp_path, **BIASES)
    cfg = config_from_hf(hf_config)
    ids, attention = inputs()
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention), output_attentions=True)
    hidden, captured = BertEncoder(cfg).apply({"params": bert_encoder_params(state, cfg)}, jnp.asarray(ids),
                                              piece_ids=jnp.asarray(attention), mutable=["intermediates"])
    assert max_error_on_valid_rows(hidden, want.last_hidden_state.numpy(), attention) < 1e-5
    assert_attention_weights_match(captured, want.attentions, attention, 4)
    assert bert_pooler_params(state) is None  # ModernBERT's classifier head is not BERT's tanh pooler


# config.json of answerdotai/ModernBERT-base (transformers 4.48's format: the older rope and pattern fields)
MODERNBERT_BASE = dict(
    architectures=["ModernBertForMaskedLM"], attention_bias=False, attention_dropout=0.0, bos_token_id=50281,
    classifier_activation="gelu", classifier_bias=False, classifier_dropout=0.0, classifier_pooling="mean",
    cls_token_id=50281, decoder_bias=True, deterministic_flash_attn=False, embedding_dropout=0.0,
    eos_token_id=50282, global_attn_every_n_layers=3, global_rope_theta=160000.0, gradient_checkpointing=False,
    hidden_activation="gelu", hidden_size=768, initializer_cutoff_factor=2.0, initializer_range=0.02,
    intermediate_size=1152, layer_norm_eps=1e-05, local_attention=128, local_rope_theta=10000.0,
    max_position_embeddings=8192, mlp_bias=False, mlp_dropout=0.0, model_type="modernbert", norm_bias=False,
    norm_eps=1e-05, num_attention_heads=12, num_hidden_layers=22, pad_token_id=50283,
    position_embedding_type="absolute", sep_token_id=50282, tie_word_embeddings=True, torch_dtype="float32",
    transformers_version="4.48.0.dev0", vocab_size=50368)


def test_modernbert_base_config_imports_silently_with_its_shapes():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = config_from_hf(MODERNBERT_BASE)
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.mlp_dim, cfg.max_length) == (22, 768, 12, 1152, 8192)
    assert (cfg.local_window, cfg.global_every, cfg.mlp, cfg.use_bias, cfg.norm_bias) == (128, 3, "geglu", False,
                                                                                          False)
    assert sum(not cfg.is_local(i) for i in range(22)) == 8  # layers 0, 3, ..., 21
    assert cfg.position.segment == "none" and cfg.layer_norm_eps == 1e-5


@pytest.mark.parametrize("field, value, message", [
    ("mlp_bias", True, "attention_bias=False, mlp_bias=True, classifier_bias=False"),
    ("classifier_activation", "relu", "hidden_activation='gelu' and classifier_activation='relu'"),
    ("hidden_activation", "tanh", "hidden_activation='tanh'"),
    ("layer_types", ["sliding_attention"] * 22, "layer_types="),
    ("rope_scaling", {"rope_type": "linear", "factor": 2.0}, "rope_scaling="),
    ("rope_parameters", {"full_attention": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type='yarn'"),
])
def test_unrepresentable_modernbert_fields_are_refused_by_name(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        config_from_hf(dict(MODERNBERT_BASE, **{field: value}))


def modernbert_folder(path, vocabulary):
    """A random ModernBertForMaskedLM with a WordPiece vocab.txt, as `jaxpos analyze --hf` and `finetune --init`
    read a BERT folder."""
    torch.manual_seed(0)
    config = dict(MODERNBERT, vocab_size=len(vocabulary), max_position_embeddings=32, pad_token_id=0)
    transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**config)).save_pretrained(path)
    (path / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    return path


def test_analyze_and_finetune_take_a_modernbert_folder(tmp_path, glue_dir):
    from jaxpos.cli import main
    from jaxpos.workflows.finetune import init_kind, load_pretrained
    from tests.training.test_finetune import FT, SMALL, WORDS, finetune_cli

    folder = modernbert_folder(tmp_path / "modernbert", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])
    assert init_kind(str(folder)) == "huggingface"
    pretrained = load_pretrained(str(folder))
    assert pretrained.cfg.local_window == 8 and "final_norm" in pretrained.encoder["encoder"]
    report = finetune_cli(["finetune", "--config", FT, "--init", str(folder), "--workdir", str(tmp_path / "ft"),
                           "--config.data.task=mrpc", f"--config.data.glue_dir={glue_dir}",
                           "--config.train.num_steps=2", *SMALL])
    assert report["step"] == 2 and report["init"]["kind"] == "huggingface"
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(" ".join(WORDS[i:] + WORDS[:i]) + "." for i in range(10)))
    out = tmp_path / "out"
    assert main(["analyze", "--hf", str(folder), "--out", str(out), "--quick", "--text", str(text),
                 "--max-sentences", "10", "--lengths", "8", "--only", "rank,attribution"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["position"] == "rope" and report["model"]["origin"]["kind"] == "huggingface"


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    from tests.training.test_finetune import glue_dir as make

    return make.__wrapped__(tmp_path_factory)


@pytest.mark.parametrize("overrides", [{}, dict(use_bias=True, norm_bias=True, tie_embeddings=False),
                                       dict(mlp="swiglu", local_window=None)],
                         ids=["modernbert_block", "biases_untied", "swiglu_all_global"])
def test_a_modern_model_exports_to_modernbert_and_imports_back(overrides, tmp_path):
    """jaxpos's modern block -> save_huggingface -> ModernBertForMaskedLM.from_pretrained: the same logits on padded
    rows, and the folder imports back to the same parameters (the mapping is one-to-one)."""
    import jax
    from flax.core import meta

    from jaxpos.checkpoints.export import save_huggingface
    from tests.helpers import tiny_config

    block = dict(vocab_size=97, max_length=24, num_layers=4, layer_norm="pre", layer_norm_eps=1e-5, mlp="geglu",
                 use_bias=False, norm_bias=False, first_layer_attention_norm=False, local_window=8, global_every=3,
                 init_std=0.2, type_vocab_size=1)
    cfg = tiny_config(dict(kind="rope", segment="none", rope=dict(base=1_000.0, local_base=50.0)),
                      **{**block, **overrides})
    ids, attention = inputs()
    params = meta.unbox(BertForMaskedLM(cfg).init(jax.random.PRNGKey(0), jnp.asarray(ids))["params"])
    leaves, treedef = jax.tree.flatten(params)  # each leaf its own noise: equal leaves would hide a swapped mapping
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    params = treedef.unflatten([x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    assert ("output_bias" in params) == cfg.tie_embeddings  # an untied decoder holds its own bias
    save_huggingface(str(tmp_path), cfg, params)
    hf = transformers.ModernBertForMaskedLM.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attention)).logits.numpy()
    got = BertForMaskedLM(cfg).apply({"params": params}, jnp.asarray(ids), piece_ids=jnp.asarray(attention))
    valid = attention.astype(bool)
    np.testing.assert_allclose(np.asarray(got)[valid], want[valid], rtol=1e-5, atol=1e-5)  # logits up to ~10
    hf_config, state = load_hf_checkpoint(str(tmp_path))
    back = config_from_hf(hf_config)
    assert back == cfg
    jax.tree.map(np.testing.assert_array_equal, bert_mlm_params(state, back), jax.tree.map(np.asarray, params))


def test_jaxpos_own_modernbert_export_reads_back_in_jaxpos_and_in_transformers(tmp_path, glue_dir):
    """A modern run exported to Hugging Face (model.safetensors, tokenizer.json, no vocab.txt): transformers'
    fast tokenizer and jaxpos read the same ids from it, and analyze --hf and finetune --init take it."""
    from jaxpos.cli import main
    from jaxpos.config.defaults import mlm_config, modern_block
    from jaxpos.data.hf_tokenizer import folder_tokenizer
    from jaxpos.workflows.mlm import train_mlm
    from tests.helpers import one_device_training
    from tests.training.test_finetune import FT, SMALL, finetune_cli

    config = mlm_config()
    modern_block(config.model, d_model=32, num_layers=3, num_heads=4, mlp_dim=48, max_length=32, local_window=8)
    config.data.update(seq_len=32, vocab_size=300, max_documents=20, tokenizer_max_sentences=2000)
    config.train.update(num_steps=2, batch_size=8, log_every=1, eval_every=2, eval_batches=1, checkpoint_every=2)
    with one_device_training():
        train_mlm(config, str(tmp_path / "run"))
    out = tmp_path / "hf"
    assert main(["export", "--workdir", str(tmp_path / "run"), "--out", str(out), "--format", "huggingface"]) == 0
    assert (out / "tokenizer.json").is_file() and not (out / "vocab.txt").exists()
    text = "The quick brown fox jumps over the lazy dog, twice."
    ours = folder_tokenizer(str(out), "modernbert")
    theirs = transformers.AutoTokenizer.from_pretrained(str(out))
    assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"] and ours.encode(text)
    assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id) == (2, 3, 0, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the standard special-token ids are known fields
        config_from_hf(json.loads((out / "config.json").read_text()))
    report_dir = tmp_path / "analysis"
    assert main(["analyze", "--hf", str(out), "--out", str(report_dir), "--quick", "--max-sentences", "10",
                 "--lengths", "8", "--only", "rank"]) == 0
    report = json.loads((report_dir / "report.json").read_text())
    assert report["sentences"]["count"] == 10 and "skipped" not in report["rank"]
    finetuned = finetune_cli(["finetune", "--config", FT, "--init", str(out), "--workdir", str(tmp_path / "ft"),
                              "--config.data.task=mrpc", f"--config.data.glue_dir={glue_dir}",
                              "--config.train.num_steps=2", *SMALL])
    assert finetuned["step"] == 2 and finetuned["init"]["kind"] == "huggingface"


def test_analyze_refuses_a_folder_where_every_diagnostic_is_skipped(tmp_path):
    from jaxpos.cli import main

    folder = modernbert_folder(tmp_path / "modernbert", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"])
    (folder / "vocab.txt").unlink()  # no tokenizer: nothing the chosen diagnostics could read
    assert main(["analyze", "--hf", str(folder), "--out", str(tmp_path / "out"), "--quick", "--only",
                 "rank,attribution"]) == 2


def modernbert_tokenizer_json_folder(path, sentences):
    """A random ModernBertForMaskedLM whose only tokenizer is a tokenizer.json that `tokenizers` trains (byte-level
    BPE, as ModernBERT's) with the special tokens after the ordinary pieces, where ModernBERT keeps them."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(sentences, trainers.BpeTrainer(
        vocab_size=400, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.add_special_tokens(["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
    ids = {t: tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]")}
    torch.manual_seed(0)
    config = dict(MODERNBERT, vocab_size=tokenizer.get_vocab_size(), max_position_embeddings=64,
                  pad_token_id=ids["[PAD]"], cls_token_id=ids["[CLS]"], sep_token_id=ids["[SEP]"],
                  bos_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"])
    hf = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**config)).eval()
    randomise(hf)
    hf.save_pretrained(path)
    tokenizer.save(str(path / "tokenizer.json"))
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    return path, hf, ids


@pytest.mark.long
def test_a_transformers_made_folder_with_only_a_tokenizer_json_imports_analyses_finetunes_and_scores_lengths(
        tmp_path, glue_dir):
    """ModernBERT as transformers saves it, its vocabulary only a tokenizer.json whose special tokens sit after the
    ordinary pieces: imported, analysed, fine-tuned, and scored at lengths, where the masked-LM loss equals the one
    transformers' own model gives on the same masked rows."""
    from jaxpos.cli import main
    from jaxpos.data import embedded_documents, split_sentences
    from jaxpos.evaluation.lengths import folder_model, length_batches
    from jaxpos.data.pipeline import held_out_stream
    from jaxpos.workflows.finetune import load_pretrained
    from tests.training.test_finetune import FT, SMALL, WORDS, finetune_cli

    sentences = [s for d in embedded_documents()[:40] for s in split_sentences(d)] + [" ".join(WORDS)]
    folder, hf, ids = modernbert_tokenizer_json_folder(tmp_path / "modernbert", sentences)
    pretrained = load_pretrained(str(folder))
    assert pretrained.cfg.local_window == 8
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(sentences[:30]))
    out = tmp_path / "analysis"
    assert main(["analyze", "--hf", str(folder), "--out", str(out), "--quick", "--text", str(text),
                 "--max-sentences", "10", "--lengths", "8", "--only", "rank"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["origin"]["vocabulary"].endswith("tokenizer.json") and "skipped" not in report["rank"]
    finetuned = finetune_cli(["finetune", "--config", FT, "--init", str(folder), "--workdir", str(tmp_path / "ft"),
                              "--config.data.task=mrpc", f"--config.data.glue_dir={glue_dir}",
                              "--config.train.num_steps=2", *SMALL])
    assert finetuned["step"] == 2 and finetuned["init"]["kind"] == "huggingface"

    model = folder_model(str(folder))
    assert (model.specials.cls, model.specials.sep, model.specials.mask) == (ids["[CLS]"], ids["[SEP]"], ids["[MASK]"])
    assert set(model.specials.reserved) == set(range(400, 405))
    assert model.train_length == 64  # its max_position_embeddings
    assert main(["evaluate", "--lengths", "16,64", "--hf", str(folder), "--max-tokens", "1200",
                 "--train-length", "32"]) == 0
    result = json.loads((folder / "lengths.json").read_text())
    assert result["train_length"] == 32 and result["bucket_width"] == 8
    assert [b["start"] for b in result["lengths"][1]["by_position"]] == list(range(0, 64, 8))
    assert main(["evaluate", "--lengths", "16", "--workdir", str(tmp_path / "ft"), "--train-length", "8"]) == 2
    stream = held_out_stream(model.data, model.tokenizer, 1200)
    batches = length_batches(stream, [16, 64], model.tokenizer, model.data.seed, model.data.mask_prob,
                             specials=model.specials)
    for entry in result["lengths"]:
        total = count = 0.0
        masked = 0
        for batch in batches[entry["length"]]:
            inputs = batch["input_ids"]
            assert inputs[:, 0].tolist() == [ids["[CLS]"]] * len(inputs) and (inputs[:, -1] == ids["[SEP]"]).all()
            masked += int((inputs == ids["[MASK]"]).sum())
            replaced = (batch["mask_weights"] > 0) & (inputs != ids["[MASK]"]) & (inputs != batch["targets"])
            assert not np.isin(inputs[replaced], model.specials.reserved).any()  # never drawn as a replacement
            assert not np.isin(batch["targets"][batch["mask_weights"] > 0], model.specials.reserved).any()
            with torch.no_grad():
                logits = hf(input_ids=torch.tensor(inputs, dtype=torch.long)).logits.double()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), torch.tensor(batch["targets"]).long(),
                                                    reduction="none").numpy()
            total += float((nll * batch["mask_weights"]).sum())
            count += float(batch["mask_weights"].sum())
        assert masked > 0.7 * count and count == entry["predicted"]  # 80% of the chosen become the folder's [MASK]
        np.testing.assert_allclose(entry["loss"], total / count, rtol=1e-4)
        assert "depths" in entry["passkey"] or entry["length"] == 16  # a key and its question need more than 16
