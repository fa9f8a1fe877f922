"""DIET (Chen et al.): decoupled positional attention, relative and absolute, and per-head segment attention."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpos.attention.bias import PositionalBias, offsets
from jaxpos.initializers import normal_init
from jaxpos.positions.base import PositionMechanism, check_length, param, sharing_axes, sharing_shape


class DietRelPosition(PositionMechanism):
    """DIET-Rel: one learned scalar per head per offset, R[h, j - i], no log-binning.

    The table covers offsets [-(n-1), n-1] (n = model.max_length) and is not inductive unless
    `diet_rel.max_distance` clips the offsets, in which case it has 2*max_distance + 1 columns.
    """

    def setup(self):
        rcfg = self.pcfg.diet_rel
        layers, heads = sharing_shape(rcfg.sharing, self.num_layers, self.cfg.num_heads)
        radius = rcfg.max_distance if rcfg.max_distance is not None else self.cfg.position_range - 1
        self.table = param(self, "table", normal_init(self.cfg.init_std), (layers, heads, 2 * radius + 1),
                           sharing_axes(layers, heads) + ("relpos",))

    def __call__(self, q_pos, k_pos):
        span = self.span(q_pos, k_pos)
        radius = (self.table.shape[-1] - 1) // 2
        if self.pcfg.diet_rel.max_distance is None:
            check_length("diet_rel", span, radius + 1, " (set position.diet_rel.max_distance to clip offsets)")
        if span <= radius + 1:  # every offset has its own column: a static slice, whose gradient is a pad
            return PositionalBias(table=self.table[..., radius - (span - 1):radius + span])
        index = jnp.clip(offsets(span), -radius, radius) + radius  # clipped: the end columns repeat
        return PositionalBias(table=jnp.take(self.table, index, axis=-1))


class DietAbsPosition(PositionMechanism):
    """DIET-Abs: per-head low-rank absolute positional attention P_Q P_K^T, d_p = head dim by default.

    With `linformer_k`, keys and values are projected along the sequence by E [k, n] (per layer), and P_K has k
    rows (DIET section 3.4). Not inductive: positions index learned tables of n rows. Linformer mixes the pieces
    of packed rows, which the model cannot see under jit, so runs refuse it from their config
    (`jaxpos.config.validate.check_packing`).
    """

    def setup(self):
        acfg = self.pcfg.diet_abs
        n, rank = self.cfg.position_range, acfg.rank or self.cfg.head_dim
        layers, heads = sharing_shape(acfg.sharing, self.num_layers, self.cfg.num_heads)
        lead = sharing_axes(layers, heads)
        init = normal_init(self.cfg.init_std)
        self.p_q = param(self, "p_q", init, (layers, heads, n, rank), lead + ("abspos", "rank"))
        key_rows = acfg.linformer_k or n
        self.p_k = param(self, "p_k", init, (layers, heads, key_rows, rank), lead + ("abspos", "rank"))
        if acfg.linformer_k:  # never causal: ModelConfig refuses it (config/mechanisms.py, _check_diet_abs)
            self.projection = param(self, "projection", normal_init(1.0 / n ** 0.5),
                                    (self.num_layers, acfg.linformer_k, n), ("layers", None, "abspos"))

    def __call__(self, q_pos, k_pos):
        n = self.p_q.shape[2]
        check_length("diet_abs", self.span(q_pos, k_pos), n)
        p_q = jnp.take(self.p_q, q_pos, axis=2)
        if self.pcfg.diet_abs.linformer_k:
            s = k_pos.shape[0]
            return PositionalBias(factors=(p_q, self.p_k), kv_projection=self.projection[:, :, :s],
                                  fold_factors=self.pcfg.diet_abs.fold)
        p_k = jnp.take(self.p_k, k_pos, axis=2)
        return PositionalBias(factors=(p_q, p_k), fold_factors=self.pcfg.diet_abs.fold)


class SegmentAttention(nn.Module):
    """DIET's per-head segment attention E_S[h, g_i, g_j]: a G x G table per head and layer.

    Replaces input segment (token type) embeddings; works with any positional mechanism.
    """

    num_layers: int
    num_heads: int
    num_segments: int
    init_std: float = 0.02

    @nn.compact
    def __call__(self) -> jax.Array:
        g = self.num_segments
        return param(self, "table", normal_init(self.init_std), (self.num_layers, self.num_heads, g, g),
                     ("layers", "heads", None, None))

