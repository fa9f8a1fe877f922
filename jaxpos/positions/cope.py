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

import flax.linen as nn

from jaxpos.attention.bias import PositionalBias
from jaxpos.positions.base import PositionMechanism, param


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
        return PositionalBias(contextual=table * head_dim**-0.5 if self.pcfg.cope.divide else table)
