"""Where attention sinks: the measures on attention whose answer is computed by hand, and `jaxpos analyze`'s
`sinks` diagnostic on a model with a learned sink logit against a numpy softmax of the model's own logits."""

import jax
import numpy as np
import pytest

from jaxpos.analysis.loading import AnalyzedModel
from jaxpos.analysis.report import analyze
from jaxpos.analysis.sinks import attention_sinks, combine_sinks, sinks_table
from jaxpos.analysis.taps import attention_logits
from tests.analysis.encoders import perturbed_encoder_params
from tests.helpers import tiny_config

CLS, SEP, PAD = 2, 3, 0


def constructed_attention():
    """Two rows, one head, one layer: row 0 is [CLS] a [SEP] (3 real queries), row 1 is [CLS] [SEP] PAD."""
    weights = np.zeros((1, 2, 1, 3, 3))
    weights[0, 0, 0] = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]
    weights[0, 1, 0] = [[0.4, 0.6, 0.0], [0.1, 0.9, 0.0], [1 / 3, 1 / 3, 1 / 3]]  # its last query is padding
    ids = np.array([[CLS, 7, SEP], [CLS, SEP, PAD]])
    valid = ids != PAD
    return weights, valid, ids


def test_the_measures_of_constructed_attention_by_hand():
    weights, valid, ids = constructed_attention()
    got = attention_sinks(weights, valid, ids, SEP)
    # five real queries: 1, .5, .2 (row 0) and .4, .1 (row 1) on the first key
    np.testing.assert_allclose(got["first"], [[(1 + .5 + .2 + .4 + .1) / 5]], rtol=1e-12)
    np.testing.assert_allclose(got["sep"], [[(0 + 0 + .5 + .6 + .9) / 5]], rtol=1e-12)
    # row 0's most-attended key (mean over its queries) is key 0 (.567), row 1's is key 1 (.75)
    np.testing.assert_allclose(got["top"], [[(1 + .5 + .2 + .6 + .9) / 5]], rtol=1e-12)
    np.testing.assert_allclose(got["learned"], [[0.0]], atol=1e-12)
    np.testing.assert_allclose(got["uniform"], [[(1 + 1 / 2 + 1 / 3 + 1 / 2 + 1 / 2) / 5]], rtol=1e-12)
    assert np.isnan(attention_sinks(weights, valid)["sep"]).all()  # no [SEP] id: not measured


def test_a_sink_takes_what_the_keys_are_not_given_and_batches_combine_by_queries():
    weights, valid, ids = constructed_attention()
    scaled = weights * 0.8  # a sink that takes a fifth of every query's attention
    got = attention_sinks(scaled, valid, ids, SEP)
    np.testing.assert_allclose(got["learned"], [[0.2]], rtol=1e-12)
    np.testing.assert_allclose(got["first"], [[0.8 * 2.2 / 5]], rtol=1e-12)
    # the two rows measured apart and combined by their real queries (3 and 2) are the rows measured together
    apart = combine_sinks([(attention_sinks(weights[:, :1], valid[:1], ids[:1], SEP), 3),
                           (attention_sinks(weights[:, 1:], valid[1:], ids[1:], SEP), 2)])
    together = attention_sinks(weights, valid, ids, SEP)
    for name in together:
        np.testing.assert_allclose(apart[name], together[name], rtol=1e-12, err_msg=name)
    assert sinks_table(got).splitlines()[2] == "| 1 | 0 | 0.352 | 0.320 | 0.512 | 0.200 | 0.567 |"


@pytest.mark.parametrize("sinks", [False, True], ids=["no_sink", "learned_sink"])
def test_the_diagnostic_on_a_model_against_a_numpy_softmax_of_its_logits(tmp_path, sinks):
    cfg = tiny_config(dict(kind="rope"), attention_sinks=sinks, max_length=16)
    rng = np.random.default_rng(3)
    sentences = [np.concatenate([[CLS], rng.integers(4, 61, n), [SEP]]).astype(np.int32) for n in (5, 9, 7, 11)]
    params = jax.tree.map(np.asarray, perturbed_encoder_params(cfg, np.asarray(sentences[:1])))
    model = AnalyzedModel("tiny", "memory", cfg, params, cls_id=CLS, sep_id=SEP)
    report = analyze(model, str(tmp_path), sentences=sentences, only=["sinks"], figures=False)["sinks"]
    first, learned, count = 0.0, 0.0, 0
    for sentence in sentences:  # one row at a time: no padding, the weights are a plain softmax
        logits = np.asarray(attention_logits(cfg, params, sentence[None]), np.float64)[:, 0]  # [L, H, T, T]
        sink = np.stack([params["encoder"][f"layer_{l}"]["self_attention"]["sinks"] for l in range(cfg.num_layers)]
                        )[:, :, None, None] if sinks else np.full(logits.shape[:2] + (1, 1), -np.inf)
        top = np.maximum(logits.max(-1, keepdims=True), sink)
        denominator = np.exp(logits - top).sum(-1, keepdims=True) + np.exp(sink - top)
        weights = np.exp(logits - top) / denominator
        first += weights[..., 0].sum(-1)  # [L, H] summed over queries
        learned += (np.exp(sink - top) / denominator)[..., 0].sum(-1)
        count += len(sentence)
    assert report["tokens"] == count
    np.testing.assert_allclose(report["first"], first / count, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(report["learned"], learned / count, rtol=1e-4, atol=1e-6)
    assert (np.asarray(report["learned"]) > 0.01).all() == sinks
