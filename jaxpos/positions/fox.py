"""The Forgetting Transformer's forget gates (FoX; Lin et al., ICLR 2025): data-dependent decay of the logits.

Each layer's heads read a gate per token from the layer's attention input, f_t = σ(w·x_t + b), and key j's logit
from query i gains D_ij = Σ_{l=j+1}^{i} log f_l: the log of the product of the gates of the tokens after the key up
to the query (the query's own included, the key's not; D_ii = 0). A constant gate f is ALiBi with slope −log f.
The authors' model is causal (keys after the query are masked); an encoder (jaxpos's extension) has a second gate
per head for keys after the query, D_ij = Σ_{l=i}^{j-1} log f'_l, the mirror image. Both are differences of
cumulative sums, D_ij = c_i − c_j, so the term costs O(T) per head beside the logits and its gradient is the row and
column sums of the logits' gradient (autodiff finds it); attention adds it on the XLA path
(`jaxpos.attention.terms.ForgetGates`). FoX uses no positional embedding: positions act through the gates alone.
Initialisation as the authors' code: w ~ N(0, init_std), b = `fox.gate_bias` (0: f ≈ 1/2 at the start).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxpos.attention.bias import ForgetGates, PositionalBias
from jaxpos.config.checks import check_number
from jaxpos.config.position import MechanismOptions
from jaxpos.initializers import normal_init
from jaxpos.positions.base import PositionMechanism, param
from jaxpos.positions.registry import Mechanism, register


@dataclasses.dataclass(frozen=True)
class FoxOptions(MechanismOptions):
    gate_bias: float = 0.0  # b at initialisation: f = σ(b) for a zero input (the authors' code: 0)

    def check(self, model) -> None:
        check_number("position.fox.gate_bias", self.gate_bias, -1e3, 1e3)
        if model.cross_attention_position and model.num_decoder_layers:
            raise ValueError("fox's gates decay over the tokens between a query and a key of its own sequence; "
                             "cross-attention has none between them: set model.cross_attention_position=False")


class FoxPosition(PositionMechanism):
    """Gate projections w [L, d, H, R] and biases b [L, H, R], R = 1 in a causal stack (keys before the query), 2
    in an encoder (and keys after it)."""

    def setup(self):
        cfg, directions = self.cfg, 1 if self.causal else 2
        self.w = param(self, "w", normal_init(cfg.init_std), (self.num_layers, cfg.d_model, cfg.num_heads, directions),
                       ("layers", "embed", "heads", None))
        bias = self.options.gate_bias
        self.b = param(self, "b", lambda key, shape, dtype: jnp.full(shape, bias, dtype),
                       (self.num_layers, cfg.num_heads, directions), ("layers", "heads", None))

    def __call__(self, q_pos, k_pos):
        return PositionalBias.of(ForgetGates(w=self.w, b=self.b))


MECHANISM = register(Mechanism(
    "fox", FoxPosition, "FoX forget gates",
    "Σ_{l=j+1..i} log σ(w·x_l + b) per head (an encoder's: a second gate for keys after the query)",
    inductive=True, learned=True, options=FoxOptions, options_text="`fox.gate_bias` (b at initialisation); XLA path",
    reference="Lin et al., 2025",
    no_position_only_term="FoX's decay is read from gates on the layer's input, so its term depends on the content",
    no_randomized_positions="FoX's positions are the order of its gates along the row, which randomized positions "
                            "do not change"))
