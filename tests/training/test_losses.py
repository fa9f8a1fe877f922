"""Token losses against direct numpy formulas; the translation task's loss on a tiny encoder-decoder."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpos.models import EncoderDecoder
from jaxpos.training.mlm import summarize_token_sums, token_cross_entropy
from jaxpos.training.translation import TranslationTask
from tests.helpers import tiny_config


def test_label_smoothed_cross_entropy_matches_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 7)).astype(np.float32)
    targets = rng.integers(0, 7, (3, 5))
    weights = (rng.random((3, 5)) < 0.7).astype(np.float32)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    eps = 0.1
    want = 0.0
    for b in range(3):
        for t in range(5):
            q = np.full(7, eps / 7)
            q[targets[b, t]] += 1 - eps  # smoothing mass spread uniformly over the vocabulary
            want += weights[b, t] * -(q * logp[b, t]).sum()
    loss, correct, weight = token_cross_entropy(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), eps)
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert float(weight) == weights.sum()
    assert float(correct) == pytest.approx((weights * (logits.argmax(-1) == targets)).sum())
    summary = summarize_token_sums({"loss": loss, "correct": correct, "weight": weight})
    assert float(summary["perplexity"]) == pytest.approx(np.exp(want / weights.sum()), rel=1e-5)


def test_translation_loss_ignores_padding():
    cfg = tiny_config(dict(kind="tisa"), num_decoder_layers=1, scale_embeddings=True, embed_layer_norm=False)
    task = TranslationTask(EncoderDecoder(cfg), 8, 6)
    args, kwargs = task.init_inputs()
    params = jax.jit(lambda: task.model.init(jax.random.PRNGKey(0), *args, **kwargs)["params"])()
    loss_fn = jax.jit(lambda p, b: task.loss(p, b, None, False))  # compiled whole: op-by-op is slow on a cold cache
    batch = {"inputs": jnp.asarray([[5, 6, 7, 3, 0, 0, 0, 0]]), "targets": jnp.asarray([[9, 8, 3, 0, 0, 0]])}
    loss, sums = loss_fn(params, batch)
    assert float(sums["weight"]) == 3.0
    unpadded = {"inputs": jnp.asarray([[5, 6, 7, 3]]), "targets": jnp.asarray([[9, 8, 3]])}  # TISA: any length
    assert float(loss_fn(params, unpadded)[0]) == pytest.approx(float(loss), rel=1e-5)
    assert float(sums["nll"]) != pytest.approx(float(sums["loss"]))  # smoothing changes the training loss
    metrics = task.summarize(sums)
    assert float(metrics["perplexity"]) == pytest.approx(np.exp(float(sums["nll"]) / 3), rel=1e-5)


def test_mlm_head_at_most_max_predictions_positions_equals_every_position():
    """max_predictions runs the output head at the masked positions only: the loss equals the all-positions
    loss whenever no row has more masked positions than that, also when it exceeds the row length."""
    from jaxpos.models import BertForMaskedLM
    from jaxpos.training.mlm import MaskedLMTask

    model = BertForMaskedLM(tiny_config(dict(kind="tisa")))
    ids = jax.random.randint(jax.random.PRNGKey(0), (2, 8), 5, 61)
    weights = jnp.zeros((2, 8)).at[0, 2].set(1.0).at[1, jnp.array([1, 6])].set(1.0)
    batch = dict(input_ids=ids, targets=jnp.roll(ids, 1, axis=1), mask_weights=weights,
                 piece_ids=jnp.ones_like(ids), token_types=jnp.zeros_like(ids))
    params = model.init(jax.random.PRNGKey(1), ids)["params"]
    losses = [float(MaskedLMTask(model, 8, k).loss(params, batch, None, False)[0]) for k in (0, 2, 32)]
    np.testing.assert_allclose(losses[1:], [losses[0]] * 2, rtol=1e-6)
