"""Token identifiability (Brunner et al., "On Identifiability in Transformers", section 4).

A probe g_l maps a hidden state e_i^l back towards its input embedding x_i; token i counts as identified when
the input embedding nearest to g_l(e_i^l) among the tokens of its own sentence is x_i. Probes: the naive
g(e) = e, a linear map, and an MLP with one hidden layer (1000, GELU); L2 loss, Adam (lr 1e-4), batch 256,
early stopping after 20 epochs without improvement on the validation split; sentences split 70/15/15.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax


def split_by_sentence(sentence_ids: np.ndarray, fractions=(0.7, 0.15, 0.15), seed: int = 0):
    """Boolean masks (train, validation, test) over tokens, splitting whole sentences."""
    sentences = np.unique(sentence_ids)
    order = np.random.default_rng(seed).permutation(sentences)
    cut1 = int(round(fractions[0] * len(order)))
    cut2 = cut1 + int(round(fractions[1] * len(order)))
    groups = (order[:cut1], order[cut1:cut2], order[cut2:])
    return tuple(np.isin(sentence_ids, g) for g in groups)


def identified(predictions: np.ndarray, inputs: np.ndarray, sentence_ids: np.ndarray) -> np.ndarray:
    """[N] bool: is x_i the nearest (L2) input embedding to prediction i among the tokens of its sentence?

    A repeated token without position embeddings has the same x at several places: a tie with x_i counts as
    identified (nothing could tell the copies apart)."""
    hits = np.zeros(len(predictions), bool)
    for sentence in np.unique(sentence_ids):
        index = np.flatnonzero(sentence_ids == sentence)
        distance = ((predictions[index, None, :] - inputs[None, index, :]) ** 2).sum(-1)  # [n, n]
        hits[index] = np.diagonal(distance) <= distance.min(axis=1)
    return hits


class _Mlp(nn.Module):
    out: int
    hidden: int = 1000

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.out)(nn.gelu(nn.Dense(self.hidden)(x), approximate=False))


@dataclasses.dataclass
class ProbeResult:
    kind: str
    epochs: int
    validation_loss: float
    predict: callable  # [N, d] -> [N, d_in]


def train_probe(kind: str, hidden: np.ndarray, inputs: np.ndarray, train: np.ndarray, validation: np.ndarray, *,
                learning_rate: float = 1e-4, batch_size: int = 256, patience: int = 20, max_epochs: int = 1000,
                seed: int = 0) -> ProbeResult:
    """Fits a `linear` or `mlp` probe from hidden states [N, d] to input embeddings [N, d_in] (L2 loss)."""
    if kind == "naive":
        if hidden.shape[1] != inputs.shape[1]:
            raise ValueError("the naive probe g(e) = e needs hidden states as wide as the input embeddings")
        return ProbeResult("naive", 0, float(((hidden[validation] - inputs[validation]) ** 2).sum(-1).mean()),
                           lambda e: e)
    if kind not in ("linear", "mlp"):
        raise ValueError(f"unknown probe {kind!r}; choose naive, linear or mlp")
    module = nn.Dense(inputs.shape[1]) if kind == "linear" else _Mlp(inputs.shape[1])
    params = module.init(jax.random.PRNGKey(seed), jnp.zeros((1, hidden.shape[1])))
    tx = optax.adam(learning_rate)
    opt_state = tx.init(params)

    def loss_fn(p, e, x):
        return jnp.mean(jnp.sum((module.apply(p, e) - x) ** 2, axis=-1))

    @jax.jit
    def step(p, s, e, x):
        loss, grads = jax.value_and_grad(loss_fn)(p, e, x)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    evaluate = jax.jit(loss_fn)
    e_train, x_train = jnp.asarray(hidden[train]), jnp.asarray(inputs[train])
    e_val, x_val = jnp.asarray(hidden[validation]), jnp.asarray(inputs[validation])
    rng = np.random.default_rng(seed)
    best, best_params, since, epoch = np.inf, params, 0, 0
    for epoch in range(1, max_epochs + 1):
        order = rng.permutation(len(e_train))
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            params, opt_state, _ = step(params, opt_state, e_train[batch], x_train[batch])
        val = float(evaluate(params, e_val, x_val))
        if val < best - 1e-9:
            best, best_params, since = val, params, 0
        else:
            since += 1
            if since >= patience:
                break
    predict = jax.jit(lambda e: module.apply(best_params, e))
    return ProbeResult(kind, epoch, best, lambda e: np.asarray(predict(jnp.asarray(e))))


def identifiability_by_layer(hidden: np.ndarray, inputs: np.ndarray, sentence_ids: np.ndarray, kind: str = "linear",
                             train_layer: int | None = None, seed: int = 0, **probe_kwargs) -> np.ndarray:
    """Identifiability rate on the test sentences, per layer. hidden [L+1, N, d], inputs [N, d_in].

    With `train_layer=None` a probe is trained for every layer and tested on it; with a layer index, one probe
    trained on that layer is tested on all layers (the paper's generalisation experiment). -> [L+1].
    """
    train, validation, test = split_by_sentence(sentence_ids, seed=seed)
    rates = []
    probe = None
    if train_layer is not None:
        probe = train_probe(kind, hidden[train_layer], inputs, train, validation, seed=seed, **probe_kwargs)
    for layer in range(len(hidden)):
        if train_layer is None:
            probe = train_probe(kind, hidden[layer], inputs, train, validation, seed=seed, **probe_kwargs)
        hits = identified(probe.predict(hidden[layer][test]), inputs[test], sentence_ids[test])
        rates.append(hits.mean())
    return np.asarray(rates)
