"""ALiBi (Press et al.): a fixed per-head linear penalty on distance, -m_h |j - i|."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jaxpos.attention.bias import PositionalBias, ToeplitzTable, offsets
from jaxpos.positions.base import PositionMechanism
from jaxpos.positions.registry import Mechanism, register


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
    """No parameters; in a causal stack the future half of the table is masked anyway."""

    def __call__(self, q_pos, k_pos):
        slopes = jnp.asarray(alibi_slopes(self.cfg.num_heads))
        distance = jnp.abs(offsets(self.span(q_pos, k_pos))).astype(jnp.float32)
        return PositionalBias.of(ToeplitzTable((-slopes[:, None] * distance[None, :])[None]))


MECHANISM = register(Mechanism("alibi", AlibiPosition, "ALiBi", "−m_h|j − i|", inductive=True, learned=False,
                               reference="Press et al., 2022"))
