"""CoPE, contextual position encoding (Golovneva et al., 2024): positions are counts of the keys a query gates.

With the content logits a_it = q_i·k_t/√D, gates g_it = σ(a_it); key j sits at p_ij = Σ_{t=j..i} g_it from query
i (clamped to P − 1, P = npos_max), and the logit gains q_i·e[p_ij], e read between ⌊p_ij⌋ and ⌈p_ij⌉ by linear
interpolation. The term depends on the logits, so attention computes it (`jaxpos.attention.bias.contextual_logits`,
on the XLA path only); this module owns e and hands it over once per forward pass.

As the authors' code: e is one [D, P] table per layer, shared by the layer's heads (each head counts with its own
gates), initialised at zero; keys a query may not attend to (padding, other pieces, the future) neither gate nor
count; and by default the term is divided by √D with q·k, (q·k + q·e[p])/√D (`cope.divide`; the paper's listing
adds it unscaled). A bidirectional stack (jaxpos's extension) counts keys after the query from the query
rightwards, Σ_{t=i..j} g_it, and reads them from a second table, so the two sides stay distinguishable.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn

from jaxpos.attention.bias import Contextual, PositionalBias
from jaxpos.config.checks import check_count
from jaxpos.config.position import MechanismOptions
from jaxpos.positions.base import PositionMechanism, param
from jaxpos.positions.registry import Mechanism, register


@dataclasses.dataclass(frozen=True)
class CopeOptions(MechanismOptions):
    # npos_max: contextual positions are counts clamped to max_position - 1, each with a learned embedding per
    # direction; 0: model.max_length + 1 (the authors' default, block size + 1: a count can reach the length)
    max_position: int = 0
    # True: (q.k + q.e[p]) / sqrt(D), the authors' model by default; False: q.k / sqrt(D) + q.e[p], the paper's
    # listing (the authors' --cope-nodiv)
    divide: bool = True

    def positions(self, max_length: int) -> int:
        """npos_max for a model of `max_length` tokens."""
        return self.max_position or max_length + 1

    def check(self, model) -> None:
        check_count("position.cope.max_position", self.max_position, 0)
        if self.max_position == 1:
            raise ValueError("position.cope.max_position=1 must be 0 (model.max_length + 1) or at least 2: with one "
                             "position every count reads the same embedding")
        if not isinstance(self.divide, bool):
            raise ValueError(f"position.cope.divide={self.divide!r} must be true or false")
        if model.cross_attention_position and model.num_decoder_layers:
            raise ValueError("cope counts the keys between a query and a key of its own sequence; cross-attention "
                             "has no such order: set model.cross_attention_position=False")


class CopePosition(PositionMechanism):
    """Inductive (counts past P − 1 read e[P − 1]); parameters: e, L × D × P per direction."""

    def setup(self):
        self.directions = 1 if self.causal else 2
        self.npos = self.pcfg.cope.positions(self.cfg.max_length)
        # Columns 0..P-1: keys at or before the query; P..2P-1 (bidirectional): keys after it.
        shape = (self.num_layers, self.cfg.head_dim, self.directions * self.npos)
        self.embedding = param(self, "embedding", nn.initializers.zeros, shape, ("layers", "kv", "relpos"))

    def __call__(self, q_pos, k_pos):
        layers, head_dim, _ = self.embedding.shape
        table = self.embedding.reshape(layers, head_dim, self.directions, self.npos).transpose(0, 2, 1, 3)
        # (q·k + q·e)/√D is q·k/√D + q·(e/√D): the division folds into the table.
        return PositionalBias.of(Contextual(table * head_dim**-0.5 if self.pcfg.cope.divide else table))


# Positions are counts clamped at max_position - 1: any length runs, with the far counts sharing the last one.
MECHANISM = register(Mechanism(
    "cope", CopePosition, "CoPE",
    "q_i·e[p_ij], p_ij = Σ_t σ(q_i·k_t/√D) over keys t from j to i (an encoder's: per direction)", inductive=True,
    learned=True, options=CopeOptions,
    options_text="`cope.max_position` (npos_max, counts clamp at it − 1; 0: `model.max_length` + 1), `cope.divide` "
                 "((q·k + q·e)/√D, the authors' code; false: q·k/√D + q·e, the paper's listing); XLA path only",
    reference="Golovneva et al., 2024",
    no_position_only_term="CoPE's positions are counts of gates σ(q.k/√D), so its term depends on the query's and "
                          "the keys' content",
    no_randomized_positions="CoPE counts its positions from gates on the content, not from the tokens' positions"))
