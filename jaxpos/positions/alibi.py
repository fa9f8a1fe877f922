"""ALiBi (Press et al.): a fixed per-head linear penalty on distance, -m_h |j - i|."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from jaxpos.attention.bias import PositionalBias, ToeplitzTable, offsets
from jaxpos.config.checks import check_count
from jaxpos.config.position import MechanismOptions
from jaxpos.positions.base import PositionMechanism
from jaxpos.positions.registry import Mechanism, register


@dataclasses.dataclass(frozen=True)
class AlibiOptions(MechanismOptions):
    heads: int | None = None  # ALiBi on the first `heads` heads (the slopes of an h-head model), the rest NoPE

    def check(self, model) -> None:
        check_count("position.alibi.heads", self.heads, 1, optional=True)
        if model is not None and self.heads is not None and self.heads > model.num_heads:
            raise ValueError(f"position.alibi.heads={self.heads} biases more heads than a layer has "
                             f"(model.num_heads={model.num_heads})")


def alibi_slopes(num_heads: int) -> np.ndarray:
    """Head slopes: the geometric sequence 2^(-8h/H); for H not a power of two, the paper's interleaving."""

    def power_of_two(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(num_heads).is_integer():
        return np.asarray(power_of_two(num_heads), np.float32)
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = power_of_two(2 * closest)[0::2][: num_heads - closest]
    return np.asarray(power_of_two(closest) + extra, np.float32)


class AlibiPosition(PositionMechanism):
    """No parameters; in a causal stack the future half of the table is masked anyway. With `alibi.heads` = h,
    the first h heads take the slopes of an h-head model and the others slope 0 (no positional term)."""

    def __call__(self, q_pos, k_pos):
        heads, num_heads = self.pcfg.alibi.heads, self.cfg.num_heads
        slopes = alibi_slopes(num_heads) if heads is None else \
            np.concatenate([alibi_slopes(heads), np.zeros(num_heads - heads, np.float32)])
        slopes = jnp.asarray(slopes)
        distance = jnp.abs(offsets(self.span(q_pos, k_pos))).astype(jnp.float32)
        return PositionalBias.of(ToeplitzTable((-slopes[:, None] * distance[None, :])[None]))


MECHANISM = register(Mechanism("alibi", AlibiPosition, "ALiBi", "−m_h|j − i|", inductive=True, learned=False,
                               options=AlibiOptions, options_text="`alibi.heads` (ALiBi on the first h heads, the "
                               "rest NoPE)", reference="Press et al., 2022"))
