"""The terms a positional mechanism adds to attention: an open family, one class per kind.

A mechanism's module returns a `PositionalBias` (jaxpos/attention/bias.py): a tuple of terms computed once per
forward pass for all layers of a stack (a leading layer axis of size L, or 1 where the layers share it), in compact
form. Each term is a pytree with a `kind` and one reference application on the XLA path, in the stage where it
acts:

    inputs    on q, k and v in the attention layer, before any implementation sees them (`on_inputs`): RoPE's
              rotation, Linformer's key projection, a scale of the queries
    logits    on the pre-softmax logits, in order, reading the content logits and q, k (`logits`): Shaw's r^K,
              DeBERTa's c2p/p2c, CoPE's contextual positions
    additive  a term added to the logits that is known without q and k (`additive`): a Toeplitz table, low-rank
              factors, a dense position-only matrix, per-head segment tables; an implementation may materialise it
              once (`jax`, `cudnn`) or read it compactly (the kernels: tables, folded factors)
    scale     on the whole logits once every term is in (`logits`): Scalable-Softmax's s log n
    weights   in place of the softmax (`weights`): a learned sink logit in its denominator
    values    on the attention output (`values`): Shaw's r^V

Attention implementations declare the kinds they take (jaxpos/attention/registry.py); a term of a new kind runs on
the XLA path with no change elsewhere. A researcher's mechanism may define its own term class here or in its own
module: subclass `Term`, give it a `kind` and `description`, and implement the stage it acts in.

Toeplitz tables: a bias that depends on the offset j - i only is a table over offsets [-(span-1), span-1]; column
`(j - i) + span - 1` holds the score for that offset. `expand_toeplitz` is the one expansion.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
from flax import struct

STAGES = ("inputs", "logits", "additive", "scale", "weights", "values")
TERM_KINDS: dict[str, type] = {}  # kind -> term class, filled by every Term subclass (the refusals name them)


def offsets(span: int) -> jnp.ndarray:
    """Offsets -(span-1) .. span-1, the columns of a Toeplitz table. Shape [2*span - 1]."""
    return jnp.arange(-(span - 1), span, dtype=jnp.int32)


def relative_offsets(q_pos: jnp.ndarray, k_pos: jnp.ndarray) -> jnp.ndarray:
    """Offsets j - i of every (query, key) pair. q_pos [T], k_pos [S] -> [T, S]; per example [B, T], [B, S] ->
    [B, T, S]."""
    return k_pos[..., None, :].astype(jnp.int32) - q_pos[..., :, None].astype(jnp.int32)


def expand_toeplitz(table: jnp.ndarray, q_pos: jnp.ndarray, k_pos: jnp.ndarray) -> jnp.ndarray:
    """Expands a table over offsets into the matrix it defines.

    table [..., W] with W = 2*span - 1 odd; q_pos [T], k_pos [S] -> [..., T, S] with
    out[..., t, s] = table[..., (k_pos[s] - q_pos[t]) + span - 1]; per example q_pos [B, T], k_pos [B, S] ->
    [B, ..., T, S]. Offsets outside the table clip to its ends.
    """
    width = table.shape[-1]
    if width % 2 != 1:
        raise ValueError(f"a Toeplitz table has an odd number of offset columns, got {width}")
    center = (width - 1) // 2
    index = jnp.clip(relative_offsets(q_pos, k_pos) + center, 0, width - 1)
    out = jnp.take(table, index, axis=-1)
    return jnp.moveaxis(out, -3, 0) if index.ndim == 3 else out


@dataclasses.dataclass
class AttentionInputs:
    """What a term reads where it acts, for one layer's call of attention (the XLA reference path).

    q [B, T, H, D], k [B, S, H, D] as attention sees them (rotated, projected, with folded channels past D);
    head_dim D (the content width); q_pos [T], k_pos [S] (per example [B, T], [B, S]); mask [B|1, 1, T, S] bool
    or None; q_types [B, T], k_types [B, S] or None; scale: the content term's factor; content_logits
    [B, H, T, S] float32: scale * q.k before the analysis switches drop anything; content / position: the
    switches (False drops q.k / every positional term)."""

    q: jax.Array
    k: jax.Array
    head_dim: int
    q_pos: jax.Array
    k_pos: jax.Array
    mask: jax.Array | None = None
    q_types: jax.Array | None = None
    k_types: jax.Array | None = None
    scale: float = 1.0
    content_logits: jax.Array | None = None
    content: bool = True
    position: bool = True


@dataclasses.dataclass(frozen=True)
class LayerOps:
    """What an attention layer lends a term that acts with the layer's own parameters or input (DeBERTa projects
    its relative embeddings with the layer's query and key projections; FoX's gates read the layer's input): the
    projections x [..., d] -> [..., H, D], the layer's hidden dropout, and its attention input [B, T, d]."""

    query: Callable
    key: Callable
    dropout: Callable
    inputs: jax.Array | None = None


@struct.dataclass
class Term:
    """Base of every attention term (module docstring). Array fields carry the leading layer axis (L or 1) that
    `for_layer` removes; fields marked static (`struct.field(pytree_node=False)`) are not arrays."""

    kind: ClassVar[str] = ""
    description: ClassVar[str] = ""  # what it is, as a refusal names it: "Shaw's relative vectors"
    stage: ClassVar[str] = "additive"
    # Depends on the positions through their offsets j - i alone: in packed rows the row's positions serve, as the
    # packing mask keeps each query inside its piece (False: it is read at each token's piece position)
    offset_invariant: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.kind:
            if cls.stage not in STAGES:
                raise ValueError(f"term {cls.__name__}: stage {cls.stage!r}; choose {', '.join(STAGES)}")
            TERM_KINDS[cls.kind] = cls

    def for_layer(self, layer: int) -> Term:
        """This term for layer `layer`: every array's leading layer axis removed (a shared axis of 1 gives its
        only entry)."""
        return jax.tree.map(lambda x: x[layer if x.shape[0] > 1 else 0], self)

    def at_pieces(self, q_BT: jax.Array, k_BS: jax.Array) -> Term:
        """One layer's term read at the positions of each token within its packed piece (q_BT [B, T], k_BS
        [B, S]); a term of offsets alone needs no read (packing masks keep queries within their piece)."""
        return self

    def at_positions(self, q_pos: jax.Array, k_pos: jax.Array) -> Term:
        """This term (all layers) for a pass at scattered positions q_pos [T], k_pos [S] (randomized positions)."""
        return self

    def in_layer(self, ops: LayerOps) -> Term:
        """One layer's term completed with what that layer lends it (`LayerOps`)."""
        return self

    def attending(self, mask: jax.Array | None) -> Term:
        """One layer's term given the keys each query attends to (mask [B|1, 1, T, S] bool, or None)."""
        return self

    def decoding(self, cache: Callable, start) -> Term:
        """One layer's term in a cached decoding step whose queries start at row `start` of the cache: `cache(name,
        x)` writes x [B, T, ...] there and returns the whole cached row [B, S, ...] (what a term read from the
        layer's input needs of the earlier steps). Default: unchanged (terms of positions alone)."""
        return self

    def on_inputs(self, q, k, v, mask, *, q_pos, k_pos, self_attention: bool, content_only: bool):
        """Stage "inputs": (q, k, v, mask) as the implementations receive them. Default: unchanged."""
        return q, k, v, mask

    def logits(self, logits: jax.Array, inputs: AttentionInputs) -> jax.Array:
        """Stage "logits": the logits [B, H, T, S] float32 with this term applied."""
        return logits

    def additive(self, inputs: AttentionInputs) -> jax.Array | None:
        """Stage "additive": the term [H'|1, T, S], or per example [B, H'|1, T, S], to add to the logits."""
        return None

    def weights(self, logits: jax.Array, inputs: AttentionInputs) -> jax.Array:
        """Stage "weights": the attention weights [B, H, T, S] from the masked logits, in place of the softmax."""
        return jax.nn.softmax(logits, axis=-1)

    def values(self, out: jax.Array, weights: jax.Array, inputs: AttentionInputs) -> jax.Array:
        """Stage "values": the attention output [B, T, H, D] with this term's contribution; weights [B, H, T, S]
        (after dropout)."""
        return out


# --- additive terms -------------------------------------------------------------------------------------------

@struct.dataclass
class ToeplitzTable(Term):
    """Scores per offset j - i: table [L', H', W], W = 2*span - 1 (TISA, DIET-Rel, T5, ALiBi, KERPLE, FIRE's
    encoder form, the attenuated offset tables). The kernels read it inside their tiles."""

    kind: ClassVar[str] = "table"
    description: ClassVar[str] = "a Toeplitz table over offsets"
    table: jax.Array = None

    def at_positions(self, q_pos, k_pos):
        return DenseBias(matrix=expand_toeplitz(self.table, q_pos, k_pos))  # once per pass, at the sampled positions

    def additive(self, inputs):
        return expand_toeplitz(self.table, inputs.q_pos, inputs.k_pos)


@struct.dataclass
class LowRankFactors(Term):
    """P_Q [L', H', T, r], P_K [L', H', S|k, r] with bias P_Q P_K^T (DIET-Abs, TUPE), folded into q.k by the fast
    paths and, with `fold`, by the XLA path too. `keyed`: P_K has a row per key position (False: Linformer's k
    projected rows, which no piece reads)."""

    kind: ClassVar[str] = "factors"
    description: ClassVar[str] = "low-rank factors"
    offset_invariant: ClassVar[bool] = False
    p_q: jax.Array = None
    p_k: jax.Array = None
    fold: bool = struct.field(pytree_node=False, default=False)
    keyed: bool = struct.field(pytree_node=False, default=True)

    def at_pieces(self, q_BT, k_BS):
        p_q = jnp.moveaxis(jnp.take(self.p_q, q_BT, axis=1), 1, 0)  # [B, H', T, r]
        p_k = jnp.moveaxis(jnp.take(self.p_k, k_BS, axis=1), 1, 0) if self.keyed else self.p_k
        return self.replace(p_q=p_q, p_k=p_k)

    def additive(self, inputs):
        return jnp.einsum("...htr,...hsr->...hts", self.p_q, self.p_k)


def fold_factors(q_BTHD, k_BSHD, factors, scale):
    """Appends P_Q/scale to q and P_K to k so that scale*q'.k' = scale*q.k + P_Q P_K^T, no [T, S] tensor.

    factors: P_Q [H'|1, T, r], P_K [H'|1, S, r], or per example (packed rows) [B, H'|1, T, r], [B, H'|1, S, r];
    scale: the content scale (1/sqrt(D) but for TUPE) -> q' [B, T, H, D + r], k' [B, S, H, D + r].
    """
    batch, _, heads, _ = q_BTHD.shape

    def per_token(p):  # [B|1, H'|1, T, r] -> [B, T, H, r]
        p = jnp.swapaxes(p if p.ndim == 4 else p[None], 1, 2)
        return jnp.broadcast_to(p, (batch, p.shape[1], heads, p.shape[-1]))

    p_q, p_k = map(per_token, factors)
    q = jnp.concatenate([q_BTHD, (p_q / scale).astype(q_BTHD.dtype)], axis=-1)
    k = jnp.concatenate([k_BSHD, p_k.astype(k_BSHD.dtype)], axis=-1)
    return q, k


@struct.dataclass
class DenseBias(Term):
    """A position-only matrix [L', H', T, S] (FIRE in a causal stack, the attenuated encoding, any table read at
    randomized positions). `normalise`: rows are a softmax over all S keys, renormalised over each query's
    attended keys (`attending`: the fixed attenuated delta)."""

    kind: ClassVar[str] = "dense"
    description: ClassVar[str] = "a dense position-only matrix"
    offset_invariant: ClassVar[bool] = False
    matrix: jax.Array = None
    normalise: bool = struct.field(pytree_node=False, default=False)

    def at_pieces(self, q_BT, k_BS):
        rows = jnp.moveaxis(jnp.take(self.matrix, q_BT, axis=1), 1, 0)  # [B, H', T, S_full]
        index = jnp.broadcast_to(k_BS[:, None, None, :], rows.shape[:3] + k_BS.shape[-1:])
        return self.replace(matrix=jnp.take_along_axis(rows, index, axis=-1))

    def attending(self, mask):
        """The matrix renormalised over each query's attended keys (its own piece; up to itself when causal), so
        that padding and packed neighbours leave a piece's term as it is in a row of its own; a query with no key
        keeps zeros."""
        if not self.normalise or mask is None:
            return self
        kept = jnp.where(mask, self.matrix, 0.0)
        total = jnp.sum(kept, axis=-1, keepdims=True)
        return self.replace(matrix=kept / jnp.where(total > 0, total, 1.0), normalise=False)

    def additive(self, inputs):
        return self.matrix


@struct.dataclass
class SegmentTable(Term):
    """DIET's per-head segment attention E_S[h, g_i, g_j]: table [L', H, G, G], read at the tokens' types; the
    kernels take it as a rank G - 1 pair term (`segment_pair_factors`)."""

    kind: ClassVar[str] = "segment"
    description: ClassVar[str] = "per-head segment tables"
    table: jax.Array = None

    def additive(self, inputs):
        if inputs.q_types is None or inputs.k_types is None:
            raise ValueError("per-head segment attention needs token types for queries and keys")
        return segment_logits(self.table, inputs.q_types, inputs.k_types)


def segment_logits(table_HGG: jax.Array, q_types_BT: jax.Array, k_types_BS: jax.Array) -> jax.Array:
    """Per-example segment bias: out[b, h, i, j] = table[h, q_types[b, i], k_types[b, j]]. -> [B, H, T, S]."""
    rows = jnp.moveaxis(jnp.take(table_HGG, q_types_BT, axis=1), 0, 1)  # [B, H, T, G]
    index = jnp.broadcast_to(k_types_BS[:, None, None, :], rows.shape[:3] + (k_types_BS.shape[-1],))
    return jnp.take_along_axis(rows, index, axis=-1)


def segment_pair_factors(table_HGG: jax.Array, q_types_BT: jax.Array, k_types_BS: jax.Array):
    """A per-head segment table as a rank G - 1 term for kernels: (u [B, T, H, G-1], w [B, S, G-1]) with
    u[b, i, h] . w[b, j] = table[h, g_i, g_j] - table[h, g_i, 0].

    The subtracted part is constant along each query's row, so softmax and every gradient are unchanged (rows of
    dS sum to zero, so table[:, :, 0] gets its gradient through the subtraction); w is one-hot in the key's type.
    """
    rows = jnp.take(table_HGG, q_types_BT, axis=1)  # [H, B, T, G]
    u = jnp.moveaxis(rows[..., 1:] - rows[..., :1], 0, 2)
    w = jax.nn.one_hot(k_types_BS, table_HGG.shape[-1], dtype=jnp.float32)[..., 1:]
    return u, w


# --- input terms ----------------------------------------------------------------------------------------------

def apply_rotary(x_BTHD: jax.Array, cos_TK: jax.Array, sin_TK: jax.Array) -> jax.Array:
    """Rotates channel pairs (x[..., k], x[..., k + D/2]) by the angle of their position (NeoX layout).

    cos, sin [T, D/2], or per example [B, T, D/2] (packed cross-attention) -> [B, T, H, D]."""
    half = x_BTHD.shape[-1] // 2
    x1, x2 = x_BTHD[..., :half], x_BTHD[..., half:]
    cos, sin = cos_TK[..., None, :], sin_TK[..., None, :]  # a head axis; [T] lines up with x's [B, T]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BTHD.dtype)


@struct.dataclass
class Rotary(Term):
    """RoPE's rotation: cos, sin [L', T, D/2] at the query positions and [L', S, D/2] at the key positions (L' = L
    where layers turn at different bases). Self-attention's keys, new ones in a cache included, sit at the query
    positions; content_only logits carry no rotation. `heads`: only the first `heads` heads turn (None: all)."""

    kind: ClassVar[str] = "rotary"
    description: ClassVar[str] = "a rotation of q and k"
    stage: ClassVar[str] = "inputs"
    cos_q: jax.Array = None
    sin_q: jax.Array = None
    cos_k: jax.Array = None
    sin_k: jax.Array = None
    heads: int | None = struct.field(pytree_node=False, default=None)

    def at_pieces(self, q_BT, k_BS):
        return self.replace(cos_q=jnp.take(self.cos_q, q_BT, axis=0), sin_q=jnp.take(self.sin_q, q_BT, axis=0),
                            cos_k=jnp.take(self.cos_k, k_BS, axis=0), sin_k=jnp.take(self.sin_k, k_BS, axis=0))

    def on_inputs(self, q, k, v, mask, *, q_pos, k_pos, self_attention, content_only):
        if content_only:
            return q, k, v, mask
        keys = (self.cos_q, self.sin_q) if self_attention else (self.cos_k, self.sin_k)
        return self._rotate(q, self.cos_q, self.sin_q), self._rotate(k, *keys), v, mask

    def _rotate(self, x_BTHD, cos, sin):
        if self.heads is None:
            return apply_rotary(x_BTHD, cos, sin)
        turned = apply_rotary(x_BTHD[..., :self.heads, :], cos, sin)
        return jnp.concatenate([turned, x_BTHD[..., self.heads:, :]], axis=-2)


def project_keys(projection_KS: jax.Array, k_BSHD: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Linformer: keys (or values) of padded positions zeroed (`mask` [B|1, 1, T, S]), then projected along the
    sequence to K rows: [B, S, H, D] -> [B, K, H, D]."""
    if mask is not None:
        k_BSHD = k_BSHD * jnp.any(mask, axis=(1, 2))[:, :, None, None].astype(k_BSHD.dtype)
    return jnp.einsum("ks,bshd->bkhd", projection_KS.astype(k_BSHD.dtype), k_BSHD)


@struct.dataclass
class KeyProjection(Term):
    """Linformer's E [L', k, S]: keys and values projected along the sequence to k rows (padded keys zeroed
    first), after which no key keeps a place to mask."""

    kind: ClassVar[str] = "kv_projection"
    description: ClassVar[str] = "Linformer key projections"
    stage: ClassVar[str] = "inputs"
    projection: jax.Array = None

    def on_inputs(self, q, k, v, mask, *, q_pos, k_pos, self_attention, content_only):
        dense_mask = None if mask is None else mask.dense(q_pos, k_pos)
        return q, project_keys(self.projection, k, dense_mask), project_keys(self.projection, v, dense_mask), None


# --- logit terms ----------------------------------------------------------------------------------------------

def clipped_offset_index(q_pos: jax.Array, k_pos: jax.Array, clip: int) -> jax.Array:
    """Column of each (i, j) pair in a table over clipped offsets -clip..clip (Shaw). -> [T, S] (per example
    [B, T, S]) int32."""
    return jnp.clip(relative_offsets(q_pos, k_pos), -clip, clip) + clip


@struct.dataclass
class ShawRelative(Term):
    """Shaw et al.'s r^K and r^V [L', 2c+1, D] over clipped offsets -c..c: the logit gains q_i . r^K_{clip(j-i)}
    (at the content scale), the output sum_j p_ij r^V_{clip(j-i)} (no r^V: `rel_values` None)."""

    kind: ClassVar[str] = "shaw"
    description: ClassVar[str] = "Shaw's relative vectors"
    stage: ClassVar[str] = "logits"
    rel_keys: jax.Array = None
    rel_values: jax.Array | None = None

    def logits(self, logits, inputs):
        q = inputs.q[..., :inputs.head_dim]
        index = clipped_offset_index(inputs.q_pos, inputs.k_pos, (self.rel_keys.shape[0] - 1) // 2)
        per_offset = jnp.einsum("bthd,wd->bhtw", q, self.rel_keys.astype(q.dtype),
                                preferred_element_type=jnp.float32) * inputs.scale
        index = index[:, None] if index.ndim == 3 else index  # per example: under the head axis
        return logits + jnp.take_along_axis(per_offset, jnp.broadcast_to(index, logits.shape), axis=-1)

    def values(self, out, weights, inputs):
        if self.rel_values is None:
            return out
        clip = (self.rel_values.shape[0] - 1) // 2
        one_hot = jax.nn.one_hot(clipped_offset_index(inputs.q_pos, inputs.k_pos, clip), 2 * clip + 1,
                                 dtype=weights.dtype)
        pairs = "btsw" if one_hot.ndim == 4 else "tsw"  # per-example offsets (packed cross-attention)
        per_offset = jnp.einsum(f"bhts,{pairs}->bhtw", weights, one_hot)  # weight mass at each clipped offset
        return out + jnp.einsum("bhtw,wd->bthd", per_offset, self.rel_values.astype(weights.dtype))


def disentangled_logits(q_BTHD: jax.Array, k_BSHD: jax.Array, rel_q_RHD: jax.Array, rel_k_RHD: jax.Array,
                        rows: jax.Array) -> jax.Array:
    """DeBERTa's c2p + p2c terms, unscaled, as transformers computes them: q_i . K_r[c_ij] + k_j . Q_r[c_ij], both at
    the row c_ij of the pair (i, j). q [B, T, H, D], k [B, S, H, D], Q_r, K_r [R, H, D], rows [T, S] (per example
    [B, T, S]) int -> [B, H, T, S] float32; per query and key a product with all R rows, then a gather."""
    c2p = jnp.einsum("bthd,rhd->bhtr", q_BTHD, rel_k_RHD.astype(q_BTHD.dtype), preferred_element_type=jnp.float32)
    p2c = jnp.einsum("bshd,rhd->bhsr", k_BSHD, rel_q_RHD.astype(k_BSHD.dtype), preferred_element_type=jnp.float32)
    rows_TS = rows[:, None] if rows.ndim == 3 else rows  # per example: under the head axis
    rows_ST = jnp.swapaxes(rows_TS, -1, -2)
    c2p = jnp.take_along_axis(c2p, jnp.broadcast_to(rows_TS, c2p.shape[:3] + rows_TS.shape[-1:]), axis=-1)
    p2c = jnp.take_along_axis(p2c, jnp.broadcast_to(rows_ST, p2c.shape[:3] + rows_ST.shape[-1:]), axis=-1)
    return c2p + jnp.swapaxes(p2c, -1, -2)  # p2c[b, h, j, i] = k_j . Q_r[c_ij]


@struct.dataclass
class Disentangled(Term):
    """DeBERTa's c2p and p2c: the normalised relative embeddings [L', R, d], which each layer projects with its own
    query and key projections (`in_layer`: Q_r, K_r [R, H, D]), and the row of each offset j - i as an integer
    Toeplitz table [L', W]; both terms at the content scale."""

    kind: ClassVar[str] = "disentangled"
    description: ClassVar[str] = "DeBERTa's disentangled relative terms (c2p, p2c)"
    stage: ClassVar[str] = "logits"
    rel_embeddings: jax.Array = None
    rel_index: jax.Array = None
    rel_q: jax.Array | None = None
    rel_k: jax.Array | None = None

    def in_layer(self, ops):
        rel = ops.dropout(self.rel_embeddings)  # as transformers
        return self.replace(rel_q=ops.query(rel), rel_k=ops.key(rel))  # [R, H, D] each

    def logits(self, logits, inputs):
        rows = expand_toeplitz(self.rel_index, inputs.q_pos, inputs.k_pos)  # [T, S] or per example [B, T, S]
        d = inputs.head_dim
        return logits + disentangled_logits(inputs.q[..., :d], inputs.k[..., :d], self.rel_q, self.rel_k,
                                            rows) * inputs.scale


@jax.checkpoint  # keeps its inputs alone for the backward pass, which recomputes gates, counts and reads
def contextual_logits(gate_logits_BHTS: jax.Array, q_BTHD: jax.Array, table_RDP: jax.Array, q_pos: jax.Array,
                      k_pos: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """CoPE's term q_i . e[p_ij] [B, H, T, S] (float32), read at fractional positions by linear interpolation.

    gate_logits [B, H, T, S]: the content logits q.k/sqrt(D), whose sigmoids g_it are the gates; q [B, T, H, D];
    table [R, D, P] (`Contextual`); q_pos [T], k_pos [S] (or per example [B, T], [B, S]), keys in order along the
    row; mask [B|1, 1, T, S] bool (None: every key): a key the query may not attend to neither gates nor counts. A
    key j at or before the query i sits at p_ij = sum of g_it over t = j..i (the reversed cumulative sum of the
    paper), one after it (R = 2) at the sum over t = i..j, read from its own table; p_ij <= P - 1.
    """
    directions, _, npos = table_RDP.shape
    gates = jax.nn.sigmoid(gate_logits_BHTS.astype(jnp.float32))
    if mask is not None:
        gates = jnp.where(mask, gates, 0.0)
    offset = relative_offsets(q_pos, k_pos)  # [T, S] j - i, or per example [B, T, S]
    offset = offset[:, None] if offset.ndim == 3 else offset  # per example: under the head axis
    before = offset <= 0
    positions = jax.lax.cumsum(jnp.where(before, gates, 0.0), axis=3, reverse=True)
    if directions == 2:  # keys after the query count from it rightwards, including it, as the causal count does
        positions = jnp.where(before, positions, jax.lax.cumsum(jnp.where(offset >= 0, gates, 0.0), axis=3))
    positions = jnp.minimum(positions, npos - 1)
    per_position = jnp.einsum("bthd,rdp->bhtrp", q_BTHD, table_RDP.astype(q_BTHD.dtype),
                              preferred_element_type=jnp.float32)  # z_i[p] for every integer p, per direction
    per_position = per_position.reshape(*per_position.shape[:3], directions * npos)
    column = 0 if directions == 1 else jnp.where(before, 0, npos)  # the after-table's columns follow the before's
    low = jnp.floor(positions)
    read = lambda p: jnp.take_along_axis(per_position, p.astype(jnp.int32) + column, axis=-1)  # noqa: E731
    weight = positions - low  # the gradient reaches the gates through the weight, as in the authors' code
    return read(jnp.ceil(positions)) * weight + read(low) * (1.0 - weight)


@struct.dataclass
class Contextual(Term):
    """CoPE's position embeddings e [L', R, D, P], shared by the heads, per direction (R = 1: keys at or before
    the query; 2: and keys after it) over contextual positions 0..P-1, read inside the logits from gates on the
    content logits (before any analysis switch drops them)."""

    kind: ClassVar[str] = "contextual"
    description: ClassVar[str] = "CoPE's contextual positions (counts of gates over the logits)"
    stage: ClassVar[str] = "logits"
    table: jax.Array = None

    def logits(self, logits, inputs):
        return logits + contextual_logits(inputs.content_logits, inputs.q[..., :inputs.head_dim], self.table,
                                          inputs.q_pos, inputs.k_pos, inputs.mask)


# --- the 2025-26 wave's block options: sinks, length-scaled logits ----------------------------------------

@struct.dataclass
class AttentionSink(Term):
    """A layer's learned sink logit per head [H] in the softmax's denominator (gpt-oss): p_ij = exp(z_ij) /
    (exp(sink_h) + Σ_j' exp(z_ij')); the sink has no value, so a row's weights sum to less than one."""

    kind: ClassVar[str] = "sink"
    description: ClassVar[str] = "a learned sink logit in the softmax"
    stage: ClassVar[str] = "weights"
    logit: jax.Array = None

    def weights(self, logits, inputs):
        sink = jnp.broadcast_to(self.logit.astype(logits.dtype)[None, :, None, None], logits.shape[:-1] + (1,))
        return jax.nn.softmax(jnp.concatenate([logits, sink], axis=-1), axis=-1)[..., :-1]


@struct.dataclass
class LengthScale(Term):
    """Scalable-Softmax (Nakanishi, 2025): each query's logits times s_h log n, n the keys it attends (its piece,
    up to itself when causal, within its window), s [H] learned per head in each layer."""

    kind: ClassVar[str] = "length_scale"
    description: ClassVar[str] = "Scalable-Softmax's length-scaled logits"
    stage: ClassVar[str] = "scale"
    s: jax.Array = None

    def logits(self, logits, inputs):
        keys = jnp.float32(logits.shape[-1]) if inputs.mask is None else \
            jnp.sum(inputs.mask, axis=-1, keepdims=True).astype(jnp.float32)  # [B|1, 1, T, 1]
        return logits * (self.s[None, :, None, None] * jnp.log(jnp.maximum(keys, 1.0)))
