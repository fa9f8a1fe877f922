"""DIET (Chen et al.): decoupled positional attention, relative and absolute, and per-head segment attention."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxpos.attention.bias import KeyProjection, LowRankFactors, PositionalBias, ToeplitzTable, offsets
from jaxpos.config.checks import check_count
from jaxpos.config.position import MechanismOptions
from jaxpos.initializers import normal_init
from jaxpos.positions.base import PositionMechanism, check_length, check_sharing, param, sharing_axes, sharing_shape
from jaxpos.positions.registry import Mechanism, When, register


@dataclasses.dataclass(frozen=True)
class DietRelOptions(MechanismOptions):
    sharing: str = "none"
    max_distance: int | None = None  # clip |j - i| to this; None = no clipping (paper), table covers max_length

    def check(self, model) -> None:
        check_sharing("diet_rel", self.sharing)
        check_count("position.diet_rel.max_distance", self.max_distance, 1, optional=True)


@dataclasses.dataclass(frozen=True)
class DietAbsOptions(MechanismOptions):
    rank: int | None = None  # d_p; None = head dim D
    sharing: str = "layer"  # layer-wise sharing is the paper's recommendation
    fold: bool = True  # fold P_Q P_K^T into the q.k dot product instead of materialising [H, T, S]
    linformer_k: int | None = None  # project keys/values to k positions (DIET section 3.4)

    def check(self, model) -> None:
        check_sharing("diet_abs", self.sharing)
        check_count("position.diet_abs.rank", self.rank, 1, optional=True)
        check_count("position.diet_abs.linformer_k", self.linformer_k, 1, optional=True)
        if not isinstance(self.fold, bool):
            raise ValueError(f"position.diet_abs.fold={self.fold!r} must be true or false")
        if not self.linformer_k:
            return
        if model.causal or model.num_decoder_layers:
            raise ValueError("diet_abs with linformer_k mixes all key positions and cannot be causal (model.causal, or "
                             "the decoder of an encoder-decoder); use it in encoder (bidirectional) stacks only")
        if model.position.randomized_max_length:
            raise ValueError("diet_abs with linformer_k projects the keys of a row's columns, not of its positions: "
                             "it cannot take position.randomized_max_length")
        if model.has_local_layers:
            raise ValueError("model.local_window masks keys around each query; Linformer "
                             "(position.diet_abs.linformer_k) projects them along the whole row first, so no key "
                             "keeps its place: set one or the other")


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
            return PositionalBias.of(ToeplitzTable(self.table[..., radius - (span - 1):radius + span]))
        index = jnp.clip(offsets(span), -radius, radius) + radius  # clipped: the end columns repeat
        return PositionalBias.of(ToeplitzTable(jnp.take(self.table, index, axis=-1)))


class DietAbsPosition(PositionMechanism):
    """DIET-Abs: per-head low-rank absolute positional attention P_Q P_K^T, d_p = head dim by default.

    With `linformer_k`, keys and values are projected along the sequence by E [k, n] (per layer), and P_K has k
    rows (DIET section 3.4). Not inductive: positions index learned tables of n rows. Linformer mixes the pieces
    of packed rows, which the model cannot see under jit, so runs refuse it from their config
    (`jaxpos.config.run.check_packing`).
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
        if acfg.linformer_k:  # never causal: its options refuse it (DietAbsOptions.check)
            self.projection = param(self, "projection", normal_init(1.0 / n ** 0.5),
                                    (self.num_layers, acfg.linformer_k, n), ("layers", None, "abspos"))

    def __call__(self, q_pos, k_pos):
        n = self.p_q.shape[2]
        check_length("diet_abs", self.span(q_pos, k_pos), n)
        p_q = jnp.take(self.p_q, q_pos, axis=2)
        fold = self.pcfg.diet_abs.fold
        if self.pcfg.diet_abs.linformer_k:
            s = k_pos.shape[0]
            return PositionalBias.of(LowRankFactors(p_q, self.p_k, fold=fold, keyed=False),
                                     KeyProjection(self.projection[:, :, :s]))
        p_k = jnp.take(self.p_k, k_pos, axis=2)
        return PositionalBias.of(LowRankFactors(p_q, p_k, fold=fold))


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



DIET_REL = register(Mechanism(
    "diet_rel", DietRelPosition, "DIET-Rel", "one scalar per head per offset",
    inductive=When("with max_distance", lambda o: o.max_distance is not None), learned=True, options=DietRelOptions,
    options_text="`diet_rel.sharing`, `diet_rel.max_distance`", reference="Chen et al., 2021"))
DIET_ABS = register(Mechanism(
    "diet_abs", DietAbsPosition, "DIET-Abs, shared by layer", "P_Q P_Kᵀ per head, folded into q·k", inductive=False,
    learned=True, options=DietAbsOptions, options_text="`diet_abs.rank`, `.sharing`, `.fold`, `.linformer_k`",
    reference="Chen et al., 2021"))
