"""The Forgetting Transformer's forget gates (FoX; Lin et al., ICLR 2025): data-dependent decay of the logits.

Each layer's heads read a gate per token from the layer's attention input, f_t = σ(w·x_t + b), and key j's logit
from query i gains D_ij = Σ_{l=j+1}^{i} log f_l: the log of the product of the gates of the tokens after the key up
to the query (the query's own included, the key's not; D_ii = 0). A constant gate f is ALiBi with slope −log f.
The authors' model is causal (keys after the query are masked); an encoder (jaxpos's extension) has a second gate
per head for keys after the query, D_ij = Σ_{l=i}^{j-1} log f'_l, the mirror image. Both are differences of
cumulative sums, D_ij = c_i − c_j, so the term costs O(T) per head beside the logits and its gradient is the row and
column sums of the logits' gradient (autodiff finds it); attention adds it on the XLA path
(`ForgetGates`, this module's term). FoX uses no positional embedding: positions act through the gates alone.
Initialisation as the authors' code: w ~ N(0, init_std), b = `fox.gate_bias` (0: f ≈ 1/2 at the start).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from jaxpos.attention.bias import PositionalBias, Term
from jaxpos.config.checks import check_number
from jaxpos.config.position import MechanismOptions
from jaxpos.initializers import normal_init
from jaxpos.positions.base import PositionMechanism, param
from jaxpos.positions.registry import Mechanism, register


@struct.dataclass
class ForgetGates(Term):
    """FoX's forget gates: gate projections w [L', d, H, R] and biases b [L', H, R] (R = 1
    causal, 2 in an encoder), read from the layer's attention input (`in_layer`: log f [B, S, H, R]); key j's logit
    from query i gains c_i − c_j, the sum of log f over the tokens after the key up to the query (before it: the
    second gate over the tokens from the query up to the one before the key). In a cached decoding step the log
    gates are the cache's whole row and the queries start at row `query_start`."""

    kind: ClassVar[str] = "forget_gates"
    description: ClassVar[str] = "FoX's forget gates (data-dependent decay)"
    stage: ClassVar[str] = "logits"
    w: jax.Array = None
    b: jax.Array = None
    log_gates: jax.Array | None = None
    query_start: jax.Array | int = 0

    def for_layer(self, layer):
        pick = lambda x: x[layer if x.shape[0] > 1 else 0]  # noqa: E731
        return self.replace(w=pick(self.w), b=pick(self.b))

    def in_layer(self, ops):
        if ops.inputs is None:
            raise ValueError("FoX's gates read the layer's attention input, which this call does not pass")
        raw = jnp.einsum("btd,dhr->bthr", ops.inputs.astype(jnp.float32), self.w.astype(jnp.float32)) + self.b
        return self.replace(log_gates=jax.nn.log_sigmoid(raw))

    def decoding(self, cache, start):
        return self.replace(log_gates=cache("log_gates", self.log_gates), query_start=start)

    def logits(self, logits, inputs):
        return logits + forget_decay(self.log_gates, self.query_start, logits.shape[-2])


def forget_decay(log_gates: jax.Array, query_start=0, num_queries: int | None = None) -> jax.Array:
    """FoX's D [B, H, T, S] from log gates [B, S, H, R] for the queries at rows query_start..query_start + T − 1
    (T = num_queries, default S): D_ij = Σ_{l=j+1..i} log f_l for j <= i (differences c_i − c_j of the inclusive
    cumulative sums), and with R = 2, D_ij = Σ_{l=i..j-1} log f'_l for j > i (reversed sums r_i − r_j)."""
    length = log_gates.shape[1]
    q_rows = query_start + jnp.arange(length if num_queries is None else num_queries)
    lower = (q_rows[:, None] >= jnp.arange(length)[None, :])[None, :, :, None]  # [1, T, S, 1]

    def differences(sums):  # [B, S, H] -> [B, T, S, H]: sums at the query rows minus sums at the keys'
        return jnp.take(sums, q_rows, axis=1)[:, :, None, :] - sums[:, None, :, :]

    before = differences(jnp.cumsum(log_gates[..., 0], axis=1))
    if log_gates.shape[-1] == 1:
        decay = jnp.where(lower, before, 0.0)
    else:
        after = differences(jnp.cumsum(log_gates[..., 1][:, ::-1], axis=1)[:, ::-1])  # r_t = Σ_{l>=t} log f'_l
        decay = jnp.where(lower, before, after)
    return jnp.moveaxis(decay, -1, 1)  # [B, H, T, S]



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
