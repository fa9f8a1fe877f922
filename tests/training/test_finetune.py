"""Fine-tuning: the head against numpy, the losses against numpy, gradients through every kind of positional
mechanism, the protocol's arithmetic, the word-order drop, and the CLI end to end on tiny GLUE-layout files
(single sentences, pairs, regression) from a jaxpos MLM run and from a random Hugging Face BERT."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from jaxpos.models import BertEncoder, BertForSequenceClassification
from jaxpos.training.finetune import ClassificationTask
from tests.helpers import folder_digest, tiny_config, train_tiny_mlm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def batch_of(rng, cfg, batch=4, length=10, labels=None):
    ids = rng.integers(5, cfg.vocab_size, (batch, length)).astype(np.int32)
    piece_ids = np.ones_like(ids)
    piece_ids[1, 7:] = 0  # padding
    token_types = np.zeros_like(ids)
    token_types[:, 5:] = 1  # sentence B
    return dict(input_ids=ids, piece_ids=piece_ids, token_types=token_types,
                labels=np.asarray(labels if labels is not None else rng.integers(0, 3, batch), np.float32))


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("pooling", ["cls", "mean", "max"])
def test_head_is_bert_pooler_then_linear_on_cls_or_over_the_tokens(pooling):
    cfg = tiny_config(dict(kind="absolute"), pooling=pooling)
    model = BertForSequenceClassification(cfg, 3)
    batch = batch_of(np.random.default_rng(0), cfg)
    inputs = dict(piece_ids=batch["piece_ids"], token_types=batch["token_types"])
    params = model.init(jax.random.PRNGKey(0), batch["input_ids"], **inputs)["params"]
    params = jax.tree.map(np.asarray, jax.tree.map(lambda x: getattr(x, "value", x), params,
                                                   is_leaf=lambda x: hasattr(x, "value")))
    logits = np.asarray(model.apply({"params": params}, batch["input_ids"], **inputs))
    hidden = np.asarray(BertEncoder(cfg).apply({"params": params["bert"]}, batch["input_ids"], **inputs))
    # by hand: each row's tokens up to its padding (row 1 has 7)
    rows = [hidden[b, :int(batch["piece_ids"][b].sum())] for b in range(4)]
    summary = {"cls": hidden[:, 0], "mean": np.stack([r.mean(0) for r in rows]),
               "max": np.stack([r.max(0) for r in rows])}[pooling]
    pooled = np.tanh(summary @ params["pooler"]["kernel"] + params["pooler"]["bias"])
    expected = pooled @ params["classifier"]["kernel"] + params["classifier"]["bias"]
    assert logits.shape == (4, 3)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
    names = jax.tree_util.tree_map(lambda x: x.names, model.init(jax.random.PRNGKey(0), batch["input_ids"])["params"],
                                   is_leaf=lambda x: hasattr(x, "names"))
    assert names["pooler"]["kernel"] == ("embed", None) and names["classifier"]["bias"] == (None,)
    with pytest.raises(ValueError, match="model.pooling='first'; choose cls, mean, max"):
        tiny_config(dict(kind="absolute"), pooling="first")


@pytest.mark.parametrize("num_labels", [3, 1], ids=["classification", "regression"])
def test_losses_are_weighted_sums(num_labels):
    cfg = tiny_config(dict(kind="tisa"))
    task = ClassificationTask(BertForSequenceClassification(cfg, num_labels), 10)
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, 4) if num_labels > 1 else rng.random(4) * 5
    batch = batch_of(rng, cfg, labels=labels)
    batch["weights"] = np.asarray([1, 1, 0, 1], np.float32)  # row 2 is eval padding
    params = jax.jit(task.model.init)(jax.random.PRNGKey(0), batch["input_ids"])["params"]
    from flax.core import meta
    params = meta.unbox(params)
    loss, sums = task.loss(params, batch, None, False)
    logits = np.asarray(task.logits(params, batch))
    w = batch["weights"]
    if num_labels > 1:
        nll = -log_softmax(logits)[np.arange(4), labels]
        np.testing.assert_allclose(float(loss), np.sum(nll * w), rtol=1e-5)
        assert float(sums["correct"]) == np.sum((logits.argmax(-1) == labels) * w)
    else:
        np.testing.assert_allclose(float(loss), np.sum((logits[:, 0] - labels) ** 2 * w), rtol=1e-5)
        assert "correct" not in sums
    assert float(sums["weight"]) == 3.0
    summary = task.summarize(sums)
    np.testing.assert_allclose(float(summary["loss"]), float(loss) / 3, rtol=1e-6)


# TISA fine-tunes in the GLUE-file tests below (their pretrained run is TISA).
@pytest.mark.parametrize("position", [dict(kind="diet_rel", segment="per_head"), dict(kind="diet_abs"),
                                      pytest.param(dict(kind="tisa"), marks=pytest.mark.slow)],
                         ids=["diet_rel_per_head_segments", "diet_abs", "tisa"])
def test_every_kind_of_mechanism_fine_tunes(position):
    """Finite gradients that reach the positional parameters (and the per-head segment tables)."""
    from flax.core import meta
    cfg = tiny_config(position, dropout=0.1, attention_dropout=0.1)
    task = ClassificationTask(BertForSequenceClassification(cfg, 2), 10)
    batch = batch_of(np.random.default_rng(2), cfg, labels=[0, 1, 1, 0])
    params = meta.unbox(task.model.init(jax.random.PRNGKey(0), batch["input_ids"])["params"])
    grads, _ = jax.jit(jax.grad(task.loss, has_aux=True), static_argnums=3)(params, batch, jax.random.PRNGKey(1),
                                                                            True)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    encoder = grads["bert"]["encoder"]
    positional = [v for k, v in encoder.items() if k in ("position", "segments")]
    assert positional, sorted(encoder)
    assert all(np.any(np.asarray(g) != 0) for tree in positional for g in jax.tree.leaves(tree))


def test_protocol_takes_the_max_over_checkpoints_then_the_median_over_seeds():
    from jaxpos.evaluation.protocol import markdown, run_score, summarize

    evals = [{"step": 10, "dev": {"accuracy": 0.5}}, {"step": 20, "dev": {"accuracy": 0.75}},
             {"step": 30, "dev": {"accuracy": 0.625}}]
    assert run_score(evals, "dev", "accuracy") == 0.75
    maxima = {2e-5: {0: 0.80, 1: 0.70, 2: 0.90}, 5e-5: {0: 0.60, 1: 0.95, 2: 0.85, 3: 0.84}}
    result = summarize(maxima)
    assert result["per_lr"][2e-5]["median"] == pytest.approx(0.80)
    assert result["per_lr"][5e-5]["median"] == pytest.approx((0.84 + 0.85) / 2)  # even count: mean of the middle
    assert result["best_lr"] == 5e-5 and result["score"] == pytest.approx(0.845)
    table = markdown([dict(model="tisa", task="mrpc", metric="dev accuracy", **result)])
    assert "| tisa | mrpc | dev accuracy | 0.8450 | 5e-05 |" in table


def test_protocol_counts_a_diverged_evaluation_as_the_worst_score_in_any_order():
    import itertools
    import math

    from jaxpos.evaluation.protocol import run_score, summarize

    nan = float("nan")
    for order in itertools.permutations([nan, 0.5, 0.25, nan]):
        evals = [{"step": 10 * (i + 1), "dev": {"pearson": v}} for i, v in enumerate(order)]
        assert run_score(evals, "dev", "pearson") == 0.5
    assert math.isnan(run_score([{"dev": {"pearson": nan}}] * 2, "dev", "pearson"))  # every evaluation diverged
    # The best learning rate does not depend on the order of the rates or of the seeds.
    maxima = {2e-5: {0: 0.7, 1: nan, 2: 0.9}, 3e-5: {0: 0.75, 1: 0.76, 2: 0.6}, 5e-5: {0: nan, 1: nan, 2: 0.99}}
    for lr_order in itertools.permutations(maxima):
        for seed_order in itertools.permutations(range(3)):
            result = summarize({lr: {s: maxima[lr][s] for s in seed_order} for lr in lr_order})
            assert result["best_lr"] == 3e-5 and result["score"] == pytest.approx(0.75)
            assert result["per_lr"][2e-5]["median"] == pytest.approx(0.7)  # the NaN seed ranks lowest
            assert math.isnan(result["per_lr"][5e-5]["median"])  # two of three seeds diverged
    assert summarize({2e-5: {0: nan}, 1e-5: {0: nan}})["best_lr"] == 1e-5  # all diverged: the smallest rate


def test_median_and_best_evaluation_rank_nan_lowest_in_any_order():
    import itertools
    import math

    from jaxpos.evaluation.protocol import median_score
    from jaxpos.workflows.finetune import best_evaluation

    nan = float("nan")
    # The median equals numpy's with NaN replaced by -inf (and is NaN where that one is -inf).
    for values in ([nan, 0.8, 0.6], [nan, nan, 0.9], [nan, 0.7, 0.9, 0.8], [nan, 0.9], [0.3, 0.9], [nan]):
        reference = np.median(np.where(np.isnan(values), -np.inf, values))
        for order in itertools.permutations(values):
            got = median_score(list(order))
            assert (math.isnan(got) and reference == -np.inf) or got == pytest.approx(reference), (order, got)
    for order in itertools.permutations([nan, 0.5, 0.25, nan]):
        evals = [{"step": 10 * (i + 1), "dev": {"pearson": v}} for i, v in enumerate(order)]
        best = best_evaluation(evals, "dev", "pearson")
        assert best["dev"]["pearson"] == 0.5 and best_evaluation(evals[::-1], "dev", "pearson") is best
    tied = [{"step": 20, "dev": {"accuracy": 0.5}}, {"step": 10, "dev": {"accuracy": 0.5}}]
    assert best_evaluation(tied, "dev", "accuracy")["step"] == 10  # the earliest of equals
    assert best_evaluation([], "dev", "accuracy") is None


def test_word_order_drop_is_original_minus_variant_accuracy():
    from jaxpos.data.classification import Example
    from jaxpos.evaluation.probes import variant_names, word_order_drops

    examples = [Example("the parser reads every token of the source file before it stops", None, 0.0),
                Example("a compiler turns readable source code into machine instructions quickly", "b", 1.0)]
    originals = {e.text_a for e in examples}
    # A stand-in "model" that is right exactly on unperturbed sentences, and on every second perturbed one.
    def accuracy(batch):
        return float(np.mean([e.text_a in originals or i % 2 == 1 for i, e in enumerate(batch)]))

    result = word_order_drops(accuracy, examples, windows=(2, 5), seed=3)
    assert [n for n, _, _ in variant_names((2, 5))] == ["local_2", "local_5", "global"]
    assert result["original"] == 1.0
    for name, values in result["variants"].items():
        assert values["accuracy"] == 0.5, name  # both sentences change under every perturbation
        assert values["drop"] == pytest.approx(result["original"] - values["accuracy"])


def test_paraphrase_probe_scores_local_sets_and_the_swapped_paraphrases():
    import types

    from jaxpos.data.classification import Example
    from jaxpos.data.paraphrase import NOT_PARAPHRASE, PARAPHRASE
    from jaxpos.workflows.probes import paraphrase_probe

    a = "and god said let there be light and there was light over the whole earth"
    b = "then god spoke and light came into being over all of the earth below"
    examples = [Example(a, b, PARAPHRASE), Example(a, "the king went up to the city with all his men", NOT_PARAPHRASE)]
    # A stand-in run that calls a pair a paraphrase exactly when sentence B is `b`: blind to the order of A.
    def predict(batch):
        logits = np.array([[0.0, 1.0] if e.text_b == b else [1.0, 0.0] for e in batch])
        return logits, np.zeros(len(batch)), np.array([e.label for e in batch])

    def evaluate(batch):
        logits, _, labels = predict(batch)
        return {"accuracy": float(np.mean(logits.argmax(-1) == labels))}

    run = types.SimpleNamespace(spec=types.SimpleNamespace(name="bible_paraphrase"), predict=predict,
                                evaluate=evaluate)
    result = paraphrase_probe(run, examples, windows=(2, 3), seed=1)
    assert result["original"] == 1.0 and result["local_drop"] == 0.0
    assert set(result["variants"]) == {"local_2", "local_3"} and result["variants"]["local_2"]["examples"] == 2
    # The swap lands in sentence A, which this run never reads: every swapped paraphrase is still called one.
    assert result["global_examples"] == 1 and result["swapped_paraphrase_share"] == 1.0
    assert result["paraphrase_share"] == 1.0
    with pytest.raises(ValueError, match="fine-tuned on bible_paraphrase"):
        paraphrase_probe(types.SimpleNamespace(spec=types.SimpleNamespace(name="mrpc")), examples)



# MRPC (pairs, classification) and STS-B (regression) in the default run; CoLA repeats MRPC's path on single sentences.
# --- end to end through the commands ----------------------------------------------------------------------------

WORDS = ["river", "mountain", "garden", "window", "city", "forest", "bridge", "castle", "harbour", "valley"]


def finetune_cli(argv):
    """The `finetune`, `evaluate`, `finetune-sweep` and `probe-word-order` subcommands, errors raised as is."""
    import argparse

    from jaxpos.cli.finetune import add_finetune_parser

    parser = argparse.ArgumentParser()
    add_finetune_parser(parser.add_subparsers(dest="command", required=True))
    args, rest = parser.parse_known_args(argv)
    assert all(r.startswith("--config.") for r in rest), rest
    return args.run(args, rest)


def write_tsv(path, header, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines("\t".join(map(str, r)) + "\n" for r in ([header] if header else []) + rows)


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory):
    """CoLA (single sentences, header-less), MRPC (pairs) and STS-B (regression) in GLUE's layout; learnable:
    CoLA's label is whether the sentence repeats its first word, MRPC's whether both sentences are equal."""
    root = tmp_path_factory.mktemp("glue")
    rng = np.random.default_rng(0)

    def sentence(n=5):
        return " ".join(rng.choice(WORDS, n))

    for split, n in (("train", 32), ("dev", 12)):
        cola = []
        for i in range(n):
            words = sentence().split()
            if i % 2:
                words[-1] = words[0]
            cola.append(("src", i % 2, "*" if i % 2 == 0 else "", " ".join(words)))
        write_tsv(root / "CoLA" / f"{split}.tsv", None, cola)
        mrpc = []
        for i in range(n):
            a = sentence()
            mrpc.append((i % 2, i, i + 1, a, a if i % 2 else sentence()))
        write_tsv(root / "MRPC" / f"{split}.tsv", ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], mrpc)
        stsb = []
        for i in range(n):
            a, b = sentence().split(), sentence().split()
            overlap = int(rng.integers(0, 6))
            b[:overlap] = a[:overlap]
            stsb.append((i, " ".join(a), " ".join(b), f"{overlap:.1f}"))
        write_tsv(root / "STS-B" / f"{split}.tsv", ["index", "sentence1", "sentence2", "score"], stsb)
    write_tsv(root / "CoLA" / "test.tsv", ["index", "sentence"], [(i, sentence()) for i in range(4)])
    return str(root)


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory):
    """A tiny TISA masked-LM run of two steps, as `jaxpos train` leaves it."""
    return train_tiny_mlm(str(tmp_path_factory.mktemp("mlm")))


FT = os.path.join(ROOT, "configs", "finetune", "glue.py")
SMALL = ["--config.data.source=glue_dir", "--config.data.max_length=24", "--config.train.batch_size=8",
         "--config.train.learning_rate=1e-3", "--config.train.log_every=1", "--config.train.eval_every=2"]


@pytest.fixture(scope="module")
def finetuned(mlm_run, glue_dir, tmp_path_factory):
    """task -> (workdir, printed output) of a run fine-tuned for 2 steps, then resumed to 4 (once per task)."""
    import contextlib
    import io

    root, done = tmp_path_factory.mktemp("finetuned"), {}

    def get(task):
        if task not in done:
            workdir = str(root / task)
            args = ["finetune", "--config", FT, "--init", mlm_run, "--workdir", workdir, f"--config.data.task={task}",
                    f"--config.data.glue_dir={glue_dir}", *SMALL]
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                finetune_cli(args + ["--config.train.num_steps=2"])
                finetune_cli(args + ["--config.train.num_steps=4"])
            done[task] = workdir, out.getvalue()
        return done[task]

    return get


@pytest.mark.parametrize("task", [pytest.param("cola", marks=pytest.mark.slow), "mrpc", "stsb"])
def test_finetune_resume_and_evaluate_on_glue_files(task, finetuned, mlm_run, glue_dir):
    from jaxpos.data.classification import TASKS

    workdir, out = finetuned(task)
    assert "resumed from checkpoint step 2" in out
    before = folder_digest(workdir)
    other = "mrpc" if task == "stsb" else "stsb"  # another number of outputs: another classifier's shape
    with pytest.raises(ValueError, match="was saved for another model .*classifier"):  # refused, nothing changed
        finetune_cli(["finetune", "--config", FT, "--init", mlm_run, "--workdir", workdir,
                      f"--config.data.task={other}", f"--config.data.glue_dir={glue_dir}", *SMALL,
                      "--config.train.num_steps=6"])
    assert folder_digest(workdir) == before
    spec = TASKS[task]
    evals = json.load(open(os.path.join(workdir, "evals.json")))["evals"]
    assert [e["step"] for e in evals] == [2, 4]
    report = json.load(open(os.path.join(workdir, "report.json")))
    assert report["step"] == 4 and report["dev"] == evals[-1]
    if spec.num_labels > 1:
        assert report["chance"]["accuracy"] == 0.5 and "chance: " in out  # 6 of 12 dev labels are 1
    else:
        assert report["chance"] is None
    scores = finetune_cli(["evaluate", "--workdir", workdir])
    for name in (*spec.metrics, "loss"):  # the same checkpoint scored again, on one device
        assert scores[name] == pytest.approx(evals[-1]["dev"][name], abs=1e-4), name
    assert all(np.isfinite(v) for v in evals[-1]["dev"].values())


def test_probe_word_order_on_a_pair_task(finetuned):
    workdir, _ = finetuned("mrpc")
    result = finetune_cli(["probe-word-order", "--workdir", workdir, "--windows", "2,3"])
    assert set(result["variants"]) == {"local_2", "local_3", "global"} and result["examples"] == 12
    assert result["original"] == pytest.approx(finetune_cli(["evaluate", "--workdir", workdir])["accuracy"])
    for values in result["variants"].values():
        assert values["drop"] == pytest.approx(result["original"] - values["accuracy"])
    assert json.load(open(os.path.join(workdir, "word_order_probe.json")))["variants"] == result["variants"]



@pytest.mark.parametrize("task", ["word_order", "bible_order"])
def test_probe_word_order_refuses_tasks_labelled_by_word_order(task, monkeypatch):
    from types import SimpleNamespace

    from jaxpos.data.classification import task_spec
    from jaxpos.workflows import probes

    monkeypatch.setattr(probes, "load_finetuned", lambda workdir, overrides: SimpleNamespace(spec=task_spec(task)))
    with pytest.raises(ValueError, match=f"the {task} task's labels are about word order"):
        probes.probe_word_order("unused")

def test_sweep_reports_the_median_over_seeds_of_the_max_over_checkpoints(mlm_run, glue_dir, tmp_path):
    out = str(tmp_path / "sweep")
    rows = finetune_cli(["finetune-sweep", "--config", FT, "--init", f"tisa={mlm_run}", "--tasks", "cola",
                         "--seeds", "0,1,2", "--learning-rates", "1e-3", "--out", out,
                         f"--config.data.glue_dir={glue_dir}", "--config.train.num_steps=4", *SMALL])
    maxima = []
    for seed in (0, 1, 2):
        evals = json.load(open(os.path.join(out, "tisa", "cola", f"lr0.001_seed{seed}", "evals.json")))["evals"]
        maxima.append(max(e["dev"]["matthews"] for e in evals))
    saved = json.load(open(os.path.join(out, "tisa", "cola", "sweep.json")))
    assert rows[0]["score"] == saved["score"] == pytest.approx(sorted(maxima)[1])
    assert "| tisa | cola | dev matthews |" in open(os.path.join(out, "sweep.md")).read()


def test_clear_errors(mlm_run, glue_dir, tmp_path):
    from jaxpos.config.defaults import finetune_config
    from jaxpos.data.classification import TASKS, jaxpos_tokenizer
    from jaxpos.workflows.finetune import load_encoded

    base = ["finetune", "--config", FT, "--workdir", str(tmp_path / "w")]
    with pytest.raises(ValueError, match="neither a jaxpos masked-LM run .* nor a Hugging Face"):
        finetune_cli(base + ["--init", str(tmp_path)])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        finetune_cli(base + ["--init", str(tmp_path / "nope")])
    with pytest.raises(ValueError, match="unknown fine-tuning task 'colaa'"):
        finetune_cli(base + ["--init", mlm_run, "--config.data.task=colaa"])
    fresh = ["finetune", "--config", FT, "--workdir", str(tmp_path / "fresh"), "--init", mlm_run]
    with pytest.raises(ValueError, match=r"train.num_epochs=-1.0 must be a number > 0"):
        finetune_cli(fresh + ["--config.train.num_epochs=-1.0"])
    with pytest.raises(ValueError, match=r"train.batch_size=0 must be an integer >= 1"):
        finetune_cli(fresh + ["--config.train.batch_size=0"])
    assert not (tmp_path / "fresh").exists()  # refused before the workdir is made
    with pytest.raises(ValueError, match="attention dropout needs attention_impl='auto', 'xla', 'pallas' or "
                                         "'mosaic_gpu', not 'cudnn'"):
        finetune_cli(base + ["--init", mlm_run, "--config.model.attention_impl=cudnn",
                             "--config.model.attention_dropout=0.1"])
    config = finetune_config()
    config.data.update(task="cola", source="glue_dir", glue_dir=glue_dir)
    with pytest.raises(ValueError, match="'test' split of task 'cola' has no labels"):
        load_encoded(config.data, "test", jaxpos_tokenizer(os.path.join(mlm_run, "spm_mlm.model")), TASKS["cola"])


def test_random_hf_bert_fine_tunes_through_the_importer(glue_dir, tmp_path):
    """A random transformers BertModel: the fine-tuning run's initial encoder and pooler give the same outputs as
    the PyTorch model; then two steps on MRPC."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from jaxpos.config.run import TrainConfig
    from jaxpos.training.finetune import FinetuneTrainer
    from jaxpos.workflows.finetune import load_pretrained

    folder = str(tmp_path / "bert")
    os.makedirs(folder)
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(vocabulary) + "\n")
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(
        vocab_size=len(vocabulary), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=32)).eval()
    hf.save_pretrained(folder)

    pretrained = load_pretrained(folder)
    train = TrainConfig(num_steps=1, batch_size=8, eval_every=1, checkpoint_every=1)  # as finetune() resolves them
    cfg = dataclasses.replace(pretrained.cfg, dropout=0.0, attention_dropout=0.0)
    task = ClassificationTask(BertForSequenceClassification(cfg, 2), 12)
    trainer = FinetuneTrainer(train, str(tmp_path / "init"), task, pretrained.encoder, pretrained.pooler, log=False)
    state, resumed = trainer.initial_state(data=None)
    trainer.close()
    assert resumed is None
    ids = np.asarray([[2, 5, 6, 7, 3, 8, 9, 3, 0, 0]], np.int32)
    types = np.asarray([[0, 0, 0, 0, 0, 1, 1, 1, 0, 0]], np.int32)
    mask = (ids > 0).astype(np.int32)
    pooled = task.model.apply({"params": jax.device_get(state.params)}, ids, piece_ids=mask, token_types=types,
                              method=BertForSequenceClassification.pool)
    with torch.no_grad():
        expected = hf(torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
                      token_type_ids=torch.tensor(types, dtype=torch.long)).pooler_output.numpy()
    np.testing.assert_allclose(np.asarray(pooled), expected, rtol=1e-4, atol=1e-5)

    workdir = str(tmp_path / "ft")
    report = finetune_cli(["finetune", "--config", FT, "--init", folder, "--workdir", workdir,
                           "--config.data.task=mrpc", f"--config.data.glue_dir={glue_dir}",
                           "--config.train.num_steps=2", *SMALL])
    assert report["step"] == 2 and report["init"]["kind"] == "huggingface"
    assert np.isfinite(report["dev"]["dev"]["f1"])


def test_a_scanned_classifier_starts_from_the_unscanned_pretrained_layers(mlm_run, tmp_path):
    """model.scan_layers in fine-tuning: the pretrained encoder (read unscanned) is stacked into the scanned
    model's layout, which then pools exactly as the unscanned classifier does."""
    from jaxpos.config.run import TrainConfig
    from jaxpos.training.finetune import FinetuneTrainer
    from jaxpos.workflows.finetune import load_pretrained

    pretrained = load_pretrained(mlm_run)
    train = TrainConfig(num_steps=1, batch_size=8, eval_every=1, checkpoint_every=1)
    ids = np.asarray([[2, 5, 6, 7, 3, 8, 9, 3, 0, 0]], np.int32)
    mask = (ids > 0).astype(np.int32)
    pooled = []
    for scan in (False, True):
        cfg = dataclasses.replace(pretrained.cfg, dropout=0.0, attention_dropout=0.0, scan_layers=scan)
        task = ClassificationTask(BertForSequenceClassification(cfg, 2), 12)
        trainer = FinetuneTrainer(train, str(tmp_path / f"scan_{scan}"), task, pretrained.encoder, pretrained.pooler,
                                  log=False)
        state, _ = trainer.initial_state(data=None)
        trainer.close()
        assert ("layers" in state.params["bert"]["encoder"]) == scan
        pooled.append(np.asarray(task.model.apply({"params": jax.device_get(state.params)}, ids, piece_ids=mask,
                                                  method=BertForSequenceClassification.pool)))
    np.testing.assert_allclose(pooled[1], pooled[0], rtol=1e-5, atol=1e-6)
