"""Beam search and greedy decoding for any autoregressive model: batched, jit-able, one token per step.

The model is a function `tokens_to_logits(ids [B*K, 1], cache) -> (logits [B*K, V] (or [B*K, 1, V]), cache)`
(K = beam size; log-probabilities work too, since log_softmax leaves them unchanged). The cache is any pytree;
leaves with a leading batch dimension B are tiled to B*K (row b*K + k is beam k of example b, the layout of
`tile_beams`) and reordered by beam every step; other leaves (a step counter, a position table) are shared.

Scores (Wu et al. 2016, GNMT §7): a finished hypothesis of n tokens, its EOS included, with log-probability
log P scores  log P / lp(n),  lp(n) = ((5 + n) / 6) ** alpha. DIET (§4.3) decodes WMT with K = 10, alpha = 0.6.

Each step every live beam proposes its V continuations; of the 2K best candidates
  * those ending in EOS that rank within the top K leave the beam as finished hypotheses and compete with the
    ones finished before for K finished slots (so K = 1 is exactly greedy decoding when alpha = 0);
  * the K best not ending in EOS are the next live beams (2K candidates always hold K of them: a beam has one
    EOS continuation).
Example b may use at most `max_decode_len[b]` tokens, EOS included; at that last position only EOS may follow
(as in fairseq), so every example ends with a finished hypothesis. Example b stops early once its best live
beam, log P = s, cannot beat its K-th finished score even at full length: s / lp(max_decode_len[b]) is the most
it can reach, since log P only falls and lp grows with n for alpha >= 0 (the bound of tensor2tensor and flax's
examples/wmt). The loop ends when every example has stopped.

Per-example limits relative to the source length: `max_decode_lengths(source_lengths, width, a, b)` gives
min(ceil(a * source_length + b), width); Vaswani et al. (2017, §6.1) decode up to source length + 50 (a=1, b=50).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

NEG_INF = -1.0e7  # the log-probability of "impossible": finite, so sums and quotients of it stay finite

TokensToLogits = Callable[[jax.Array, Any], tuple[jax.Array, Any]]


def length_penalty(length, alpha):
    """GNMT's lp(n) = ((5 + n) / 6) ** alpha, for Python numbers or arrays of lengths n."""
    return ((5.0 + length) / 6.0) ** alpha


def tile_beams(x: jax.Array, beam_size: int) -> jax.Array:
    """[B, ...] -> [B*K, ...], each example repeated K times in a row (the layout of the beams' cache)."""
    return jnp.repeat(x, beam_size, axis=0)


def max_decode_lengths(source_lengths, width: int, a: float = 1.0, b: float = 50.0) -> jax.Array:
    """Token limits [B] (EOS included): min(ceil(a * source_length + b), width), at least 1. `width` is the
    static output width of `beam_search`, e.g. the model's maximum target length."""
    limits = jnp.ceil(a * jnp.asarray(source_lengths, jnp.float32) + b).astype(jnp.int32)
    return jnp.clip(limits, 1, width)


class _State(NamedTuple):
    step: jax.Array  # [] tokens generated so far
    live_seqs: jax.Array  # [B, K, W+1] int32, column 0 holds BOS
    live_logprobs: jax.Array  # [B, K] float32, sorted best first; NEG_INF marks an empty beam
    finished_seqs: jax.Array  # [B, K, W+1] int32
    finished_scores: jax.Array  # [B, K] float32, length-normalised, sorted best first
    finished: jax.Array  # [B, K] bool, the slot holds a hypothesis
    cache: Any  # batched leaves [B*K, ...]


def _take_beams(x: jax.Array, beams: jax.Array) -> jax.Array:
    """x [B, N, ...] indexed by beams [B, K] -> [B, K, ...]."""
    return x[jnp.arange(x.shape[0])[:, None], beams]


def _is_batched_default(batch_size: int) -> Callable[[Any, jax.Array], bool]:
    return lambda path, leaf: jnp.ndim(leaf) >= 1 and jnp.shape(leaf)[0] == batch_size


def beam_search(tokens_to_logits: TokensToLogits, initial_cache: Any, batch_size: int, beam_size: int,
                alpha: float, eos_id: int, max_decode_len, *, bos_id: int = 0, decode_width: int | None = None,
                is_batched: Callable[[Any, jax.Array], bool] | None = None) -> tuple[jax.Array, jax.Array]:
    """Beam search of K = `beam_size` beams for B = `batch_size` examples (see the module docstring).

    `max_decode_len`: an int, or per-example token limits [B] (EOS included; see `max_decode_lengths`).
    `decode_width` W: the static output width, by default `max_decode_len` (or its maximum, for a concrete
    array; give it explicitly when the limits are traced). `is_batched(path, leaf)`: which cache leaves carry
    the batch (default: those with a leading dimension B). `bos_id`: the token fed first.
    Returns (sequences [B, K, W] int32, without BOS, 0 after EOS; scores [B, K] float32, -inf for an empty
    slot), both sorted best first.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size={beam_size}; need at least 1")
    if isinstance(alpha, (int, float)) and alpha < 0:
        raise ValueError(f"alpha={alpha}; the early-stopping bound needs alpha >= 0")
    if decode_width is None:
        try:
            decode_width = int(np.max(np.asarray(max_decode_len)))
        except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError) as error:
            raise ValueError("max_decode_len is traced: pass decode_width, the static output width") from error
    B, K, W = batch_size, beam_size, int(decode_width)
    limits = jnp.clip(jnp.broadcast_to(jnp.asarray(max_decode_len, jnp.int32), (B,)), 1, W)
    # decided once on the initial cache: the tiled leaves no longer have a leading B
    batched = jax.tree_util.tree_map_with_path(is_batched or _is_batched_default(B), initial_cache)

    def regroup(cache, beams):  # reorders the batched cache leaves by beam origin beams [B, K]
        rows = (jnp.arange(B)[:, None] * K + beams).reshape(-1)
        return jax.tree_util.tree_map(lambda flag, leaf: leaf[rows] if flag else leaf, batched, cache)

    seqs0 = jnp.zeros((B, K, W + 1), jnp.int32).at[:, :, 0].set(bos_id)
    state = _State(
        step=jnp.zeros((), jnp.int32), live_seqs=seqs0,
        live_logprobs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (K - 1), jnp.float32), (B, 1)),  # one beam at first
        finished_seqs=seqs0, finished_scores=jnp.full((B, K), NEG_INF, jnp.float32),
        finished=jnp.zeros((B, K), bool),
        cache=jax.tree_util.tree_map(lambda flag, leaf: tile_beams(leaf, K) if flag else leaf, batched,
                                     initial_cache))

    def stopped(s: _State) -> jax.Array:  # [B]
        best_possible = s.live_logprobs[:, 0] / length_penalty(limits.astype(jnp.float32), alpha)
        kth_finished = jnp.where(s.finished[:, -1], s.finished_scores[:, -1], NEG_INF)
        no_live = s.live_logprobs[:, 0] <= NEG_INF / 2
        return (s.step >= limits) | no_live | (kth_finished >= best_possible)

    def cond(s: _State) -> jax.Array:
        return (s.step < W) & ~jnp.all(stopped(s))

    def body(s: _State) -> _State:
        ids = jax.lax.dynamic_index_in_dim(s.live_seqs, s.step, axis=2, keepdims=False).reshape(B * K, 1)
        logits, cache = tokens_to_logits(ids, s.cache)
        V = logits.shape[-1]
        log_probs = jax.nn.log_softmax(logits.reshape(B, K, V).astype(jnp.float32), axis=-1)
        n = s.step + 1  # candidates' length, EOS included
        at_limit = (n >= limits)[:, None, None] & (jnp.arange(V) != eos_id)
        log_probs = jnp.where(at_limit, NEG_INF, log_probs)  # the last allowed position takes only EOS
        candidates = (s.live_logprobs[:, :, None] + log_probs).reshape(B, K * V)
        top_logprobs, top_index = jax.lax.top_k(candidates, 2 * K)  # [B, 2K]
        top_beams, top_tokens = top_index // V, top_index % V
        top_seqs = _take_beams(s.live_seqs, top_beams).at[:, :, n].set(top_tokens)
        valid = (top_logprobs > NEG_INF / 2) & (n <= limits)[:, None]
        is_eos = top_tokens == eos_id

        live_logprobs, live_rank = jax.lax.top_k(jnp.where(is_eos | ~valid, NEG_INF, top_logprobs), K)
        live_seqs = _take_beams(top_seqs, live_rank)
        cache = regroup(cache, _take_beams(top_beams, live_rank))

        leaving = is_eos & valid & (jnp.arange(2 * K) < K)  # only EOS candidates that made the beam finish
        scores = jnp.where(leaving, top_logprobs / length_penalty(n.astype(jnp.float32), alpha), NEG_INF)
        pool_scores = jnp.concatenate([s.finished_scores, scores], axis=1)  # the kept ones first: ties keep them
        pool_flags = jnp.concatenate([s.finished, leaving], axis=1)
        finished_scores, rank = jax.lax.top_k(jnp.where(pool_flags, pool_scores, 2 * NEG_INF), K)
        return _State(step=n, live_seqs=live_seqs, live_logprobs=live_logprobs,
                      finished_seqs=_take_beams(jnp.concatenate([s.finished_seqs, top_seqs], axis=1), rank),
                      finished_scores=finished_scores, finished=_take_beams(pool_flags, rank), cache=cache)

    final = jax.lax.while_loop(cond, body, state)
    scores = jnp.where(final.finished, final.finished_scores, -jnp.inf)
    return final.finished_seqs[:, :, 1:], scores


def greedy_decode(tokens_to_logits: TokensToLogits, initial_cache: Any, batch_size: int, eos_id: int,
                  max_decode_len, *, bos_id: int = 0, decode_width: int | None = None,
                  is_batched: Callable[[Any, jax.Array], bool] | None = None) -> tuple[jax.Array, jax.Array]:
    """Greedy decoding: the argmax token each step until EOS or the limit. Beam search with K = 1 and alpha = 0
    (a length penalty cannot change a single hypothesis). Returns (sequences [B, W], log-probabilities [B])."""
    seqs, scores = beam_search(tokens_to_logits, initial_cache, batch_size, 1, 0.0, eos_id, max_decode_len,
                               bos_id=bos_id, decode_width=decode_width, is_batched=is_batched)
    return seqs[:, 0], scores[:, 0]
