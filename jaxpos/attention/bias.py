"""The compact positional bias that travels from a positional mechanism to the attention function: a tuple of
terms (jaxpos/attention/terms.py), computed once per forward pass for all layers of a stack, never per example.

In packed rows only the read becomes per example: `piece_positions` says where each token sits in its own piece,
and `at_pieces` has each term read its rows there (per layer, inside attention). Packed cross-attention also hands
attention per-pair query and key positions [B, T] / [B, S], from which Toeplitz tables and Shaw vectors take their
offsets (a pair's source and target start at different columns). `for_layer` picks a layer's slice of every term;
terms stay compact (tables, low-rank factors) so that attention implementations can avoid materialising
[H, T, S]; `position_logits` is the reference expansion of the position-only ones.
"""

from __future__ import annotations

from typing import Iterable, TypeVar

import jax
from flax import struct

from jaxpos.attention.terms import (AttentionInputs, AttentionSink, Contextual, DenseBias, Disentangled,
                                    KeyProjection, LayerOps, LengthScale, LowRankFactors, Rotary, SegmentTable,
                                    ShawRelative, Term, ToeplitzTable,
                                    clipped_offset_index, contextual_logits, disentangled_logits, expand_toeplitz,
                                    offsets, relative_offsets, segment_logits, segment_pair_factors)

__all__ = ["AttentionInputs", "AttentionSink", "Contextual", "DenseBias", "Disentangled", "KeyProjection", "LayerOps",
           "LengthScale", "LowRankFactors", "PositionalBias", "Rotary", "SegmentTable", "ShawRelative", "Term",
           "ToeplitzTable",
           "at_pieces", "clipped_offset_index", "contextual_logits", "disentangled_logits", "expand_toeplitz",
           "offsets", "position_logits", "relative_offsets", "segment_logits", "segment_pair_factors"]

T = TypeVar("T", bound=Term)


@struct.dataclass
class PositionalBias:
    """What a mechanism hands to attention for all layers of a stack: its `terms` (each with a leading layer axis
    of size L or 1), the factor on the content term q.k/sqrt(D) (`content_scale`: 1 everywhere but TUPE's
    1/sqrt(2) and DeBERTa's 1/sqrt(3); static), and for packed rows the positions within each piece (q [B, T],
    k [B, S], no layer axis) at which the terms read their rows."""

    terms: tuple[Term, ...] = ()
    piece_positions: tuple[jax.Array, jax.Array] | None = None
    content_scale: float = struct.field(pytree_node=False, default=1.0)

    @classmethod
    def of(cls, *terms: Term | None, content_scale: float = 1.0) -> PositionalBias:
        """The bias of the given terms (None left out)."""
        return cls(terms=tuple(t for t in terms if t is not None), content_scale=content_scale)

    def get(self, kind: type[T]) -> T | None:
        """The term of class `kind`, or None."""
        return next((t for t in self.terms if isinstance(t, kind)), None)

    def term(self, kind: str) -> Term | None:
        """The term of kind `kind` ("table", "rotary", ...), or None."""
        return next((t for t in self.terms if t.kind == kind), None)

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(t.kind for t in self.terms)

    def with_terms(self, terms: Iterable[Term]) -> PositionalBias:
        return self.replace(terms=tuple(terms))

    def add(self, term: Term) -> PositionalBias:
        """This bias with `term` after its own."""
        return self.replace(terms=(*self.terms, term))

    def for_layer(self, layer: int) -> PositionalBias:
        """The slice of layer `layer` (leading axes removed; shared terms give their only entry)."""
        return self.replace(terms=tuple(t.for_layer(layer) for t in self.terms))

    def without_positions(self) -> PositionalBias:
        """A NoPE layer's slice: the mechanism's terms and content scale dropped, per-head segments kept."""
        return PositionalBias(terms=tuple(t for t in self.terms if isinstance(t, SegmentTable)),
                              piece_positions=self.piece_positions)

    def at_positions(self, q_pos: jax.Array, k_pos: jax.Array) -> PositionalBias:
        """The bias of a pass at scattered positions (randomized positions): each term read there once."""
        return self.replace(terms=tuple(t.at_positions(q_pos, k_pos) for t in self.terms))

    def in_layer(self, ops: LayerOps) -> PositionalBias:
        return self.replace(terms=tuple(t.in_layer(ops) for t in self.terms))

    def attending(self, mask) -> PositionalBias:
        return self.replace(terms=tuple(t.attending(mask) for t in self.terms))

    @property
    def has_position_logits(self) -> bool:
        """Whether a term acts on the logits (every stage but the inputs')."""
        return any(t.stage != "inputs" for t in self.terms)


def at_pieces(bias: PositionalBias) -> PositionalBias:
    """One layer's slice with every term read at its `piece_positions` (unchanged without them)."""
    if bias.piece_positions is None:
        return bias
    q_BT, k_BS = bias.piece_positions
    return bias.replace(terms=tuple(t.at_pieces(q_BT, k_BS) for t in bias.terms), piece_positions=None)


def position_logits(bias: PositionalBias, q_pos: jax.Array, k_pos: jax.Array, *, include_factors: bool = True,
                    q_types=None, k_types=None) -> jax.Array | None:
    """The additive terms of one layer, materialised and summed in order: [H'|1, T, S], or [B, H'|1, T, S] when
    read at piece positions, given per-example positions q_pos [B, T], k_pos [B, S] or per-example types (None if
    there are none). `include_factors` False leaves low-rank factors out (folded into q and k instead)."""
    bias = at_pieces(bias)
    inputs = AttentionInputs(q=None, k=None, head_dim=0, q_pos=q_pos, k_pos=k_pos, q_types=q_types, k_types=k_types)
    total = None
    for term in bias.terms:
        if term.stage != "additive" or (isinstance(term, LowRankFactors) and not include_factors):
            continue
        value = term.additive(inputs)
        if value is None:
            continue
        if total is not None and value.ndim != total.ndim:  # per example beside shared: a batch axis for both
            value, total = ensure_4d(value), ensure_4d(total)
        total = value if total is None else total + value
    return total


def kernel_pair(bias: PositionalBias, q_types, k_types) -> tuple[jax.Array, jax.Array] | None:
    """A per-head segment table as the rank G - 1 pair (u [B, T, H, G-1], w [B, S, G-1]) of
    `segment_pair_factors`; None without one (or with one type: a constant, which softmax ignores)."""
    segments = bias.get(SegmentTable)
    if segments is None or segments.table.shape[-1] == 1:
        return None
    if q_types is None or k_types is None:
        raise ValueError("per-head segment attention needs token types for queries and keys")
    return segment_pair_factors(segments.table, q_types, k_types)


def stacked_table(bias: PositionalBias) -> jax.Array | None:
    """The Toeplitz table [H', W] of one layer's slice, or None."""
    table = bias.get(ToeplitzTable)
    return None if table is None else table.table


def ensure_4d(x: jax.Array) -> jax.Array:
    return x if x.ndim == 4 else x[None]


__all__ += ["ensure_4d", "kernel_pair", "stacked_table"]
