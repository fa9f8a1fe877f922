"""Report diagnostics on in-memory encoders: the logit rank is the rank of the true pre-softmax logits, and
diagnostics whose bookkeeping cannot express the model's values are skipped with a reason."""

import jax
import numpy as np
import pytest

from jaxpos.analysis.loading import AnalyzedModel
from jaxpos.analysis.rank import numerical_rank
from jaxpos.analysis.report import analyze, token_windows
from jaxpos.analysis.taps import run_encoder
from tests.analysis.encoders import perturbed_encoder_params
from tests.helpers import tiny_config

SENTENCES = [np.random.default_rng(7).integers(4, 61, 9).astype(np.int32) for _ in range(8)]


def in_memory_model(cfg):
    params = perturbed_encoder_params(cfg, np.asarray(SENTENCES[:1]))
    return AnalyzedModel("tiny", "memory", cfg, jax.tree.map(np.asarray, params))


@pytest.mark.parametrize("d_model,length", [(32, 6), (8, 12)], ids=["D8_T6_full_rank", "D2_T12_rank_D"])
def test_logit_rank_is_the_rank_of_the_true_logits(tmp_path, d_model, length):
    """Post-LN, no positions: logits[h] = (x W_Q + b_Q)(x W_K + b_K)^T / sqrt(D) from each layer's input x. With
    T = 6 < D = 8 they have full rank 6, which centring log-weights by row (a rank-one subtraction) made 5."""
    cfg = tiny_config(dict(kind="none"), d_model=d_model, max_length=16)
    model = in_memory_model(cfg)
    report = analyze(model, str(tmp_path), sentences=SENTENCES, only=["rank"], lengths=(length,), windows=3,
                     figures=False)["rank"]
    rows = token_windows(model, SENTENCES, length, 3)
    assert report["length"] == length and report["windows"] == len(rows) == 3
    ranks = []
    for row in rows:
        _, states = run_encoder(cfg, model.params, row[None])
        per_layer = []
        for layer in range(cfg.num_layers):
            attention = jax.tree.map(lambda a: np.asarray(a, np.float64),
                                     model.params["encoder"][f"layer_{layer}"]["self_attention"])
            x = np.asarray(states[layer, 0], np.float64)
            q = np.einsum("td,dhk->htk", x, attention["query"]["kernel"]) + attention["query"]["bias"][:, None]
            k = np.einsum("td,dhk->htk", x, attention["key"]["kernel"]) + attention["key"]["bias"][:, None]
            per_layer.append(numerical_rank(np.einsum("htk,hsk->hts", q, k) / np.sqrt(cfg.head_dim)))
        ranks.append(per_layer)
    want = np.mean(ranks, axis=0)  # [L, H]
    assert np.all(want == min(length, cfg.head_dim))  # the generic rank, so the comparison means something
    np.testing.assert_array_equal(report["logit_rank"], want)
    assert report["logit_rank_max"] == int(want.max())


@pytest.mark.parametrize("position,named", [
    (dict(kind="shaw", shaw=dict(clip=3, values=True)), "Shaw"),
    (dict(kind="diet_abs", diet_abs=dict(linformer_k=4)), "Linformer"),
], ids=["shaw_values", "linformer"])
def test_value_bookkeeping_diagnostics_are_skipped(tmp_path, position, named):
    """Effective attention and the decomposition read the head outputs as A (E W_V) W_O: Shaw's r^V adds a
    positional term to the values, Linformer projects keys and values along the sequence."""
    model = in_memory_model(tiny_config(position))
    report = analyze(model, str(tmp_path), sentences=SENTENCES, only=["effective_attention", "decomposition"],
                     lengths=(8,), windows=2, figures=False)
    for name in ("effective_attention", "decomposition"):
        assert named in report[name]["skipped"], name
    assert set(report["skipped"]) == {"effective_attention", "decomposition"}


def test_position_only_diagnostics_skip_cope_with_the_reason(tmp_path):
    """CoPE's positions are counts of content gates: the rank diagnostic's position-only part (ranks, Toeplitz R²)
    and the position-only attention say why they are left out; the logit rank itself is the model's."""
    from jaxpos.reproduction.pipeline import positional_attention

    model = in_memory_model(tiny_config(dict(kind="cope")))
    report = analyze(model, str(tmp_path), sentences=SENTENCES, only=["rank"], lengths=(8,), windows=2,
                     figures=False)["rank"]
    why = ("position.kind='cope' has no position-only logits: CoPE's positions are counts of gates σ(q.k/√D), so its "
           "term depends on the query's and the keys' content")
    assert report["positional"]["skipped"] == why
    assert report["logit_rank_max"] >= 1
    assert positional_attention(model.cfg, model.params, 8) == {"skipped": why}
