"""DeBERTa's disentangled attention (He et al., ICLR 2021), as v2/v3 in transformers' `DebertaV2Model`.

logits_ij = (q_i . k_j + q_i . K_r[c_ij] + k_j . Q_r[c_ij]) / sqrt(3D): content-to-content, content-to-position
(c2p) and position-to-content (p2c). Q_r and K_r are the relative embeddings, normalised by one LayerNorm and shared
by all layers, projected by each layer's own query and key projections (biases included: transformers'
share_att_key); c_ij is the table row of the log-bucketed relative position i - j (query minus key). The paper
prints p2c at delta(j, i); transformers reads it at the same row c_ij as c2p, and the released checkpoints were
trained with that code, so jaxpos follows transformers. No absolute positions enter the input.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxpos.attention.bias import Disentangled, PositionalBias
from jaxpos.config.checks import check_count
from jaxpos.config.position import MechanismOptions
from jaxpos.initializers import normal_init
from jaxpos.positions.base import PositionMechanism, param
from jaxpos.positions.registry import Mechanism, register


@dataclasses.dataclass(frozen=True)
class DebertaOptions(MechanismOptions):
    # DeBERTa-v3-base's values. position_buckets: log-bucketed offsets (transformers' make_log_bucket_position),
    # 2 * position_buckets table rows; 0: offsets clamped to +-max_relative_positions, 2 * max_relative_positions
    # rows (transformers: position_buckets <= 0; its max_relative_positions < 1 means max_position_embeddings).
    position_buckets: int = 256
    max_relative_positions: int = 512  # with buckets: the offset at which the log buckets reach the table's end

    def check(self, model) -> None:
        """Raises a ValueError unless the bucket function is well defined (no log(0) or division by log(1))."""
        check_count("position.deberta.max_relative_positions", self.max_relative_positions, 1)
        if self.position_buckets == 0:
            return
        if isinstance(self.position_buckets, bool) or not isinstance(self.position_buckets, int) \
                or self.position_buckets < 2:
            raise ValueError(f"position.deberta.position_buckets={self.position_buckets!r} must be 0 (no buckets) "
                             "or an integer >= 2")
        if self.max_relative_positions <= self.position_buckets // 2 + 1:
            raise ValueError(
                f"position.deberta.max_relative_positions={self.max_relative_positions} must be greater than "
                f"position_buckets/2 + 1 = {self.position_buckets // 2 + 1}: the log buckets divide by "
                f"log((max_relative_positions - 1) / (position_buckets/2)); or set position_buckets=0")


def log_bucket(relative: np.ndarray, position_buckets: int, max_relative_positions: int) -> np.ndarray:
    """transformers' `make_log_bucket_position`: relative positions i - j [...] -> buckets [...] int64.

    Exact below position_buckets/2 in magnitude, log-spaced beyond (sign kept), reaching position_buckets - 1 at
    max_relative_positions - 1 and growing past it (the table row clamps). Computed in float32 as transformers
    does (float64 moves some buckets by one), in NumPy, so that the buckets are the same on every backend.
    """
    rel = np.asarray(relative, np.int64)
    mid = position_buckets // 2
    abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
    ratio = (np.maximum(abs_pos, mid) / mid).astype(np.float32)  # no log(0): those offsets keep i - j
    scale = _log32(np.float32((max_relative_positions - 1) / mid))
    log_pos = np.ceil(_log32(ratio) / scale * np.float32(mid - 1)) + np.float32(mid)
    return np.where(abs_pos <= mid, rel, (log_pos * np.sign(rel)).astype(np.int64))


def _log32(x) -> np.ndarray:
    """The float32 log correctly rounded, the same on every machine (float32 log implementations differ in the last
    bit, which moves a bucket now and then; none at the released sizes, tests/positions/test_deberta.py)."""
    return np.log(np.asarray(x, np.float64)).astype(np.float32)


def relative_rows(relative: np.ndarray, position_buckets: int, max_relative_positions: int) -> np.ndarray:
    """The relative-embedding row of each relative position i - j [...] -> [...] int32, as transformers' c2p and
    p2c read it: clamp(bucket(i - j) + span, 0, 2 span - 1), span = position_buckets (log buckets) or
    max_relative_positions (position_buckets = 0: plain offsets)."""
    rel = np.asarray(relative, np.int64)
    span = position_buckets or max_relative_positions
    if position_buckets:
        rel = log_bucket(rel, position_buckets, max_relative_positions)
    return np.clip(rel + span, 0, 2 * span - 1).astype(np.int32)


class DebertaPosition(PositionMechanism):
    """Relative embeddings [2 span, d] and their LayerNorm, shared by all layers of the stack. Inductive: far
    offsets share the table's end rows.

    Returns the normalised embeddings [1, R, d] (each attention layer projects them with its own query and key
    projections), the row of each offset j - i as an integer Toeplitz table [1, 2*span - 1], and the content
    scale 1/sqrt(3): transformers divides every term by sqrt(3D).
    """

    def setup(self):
        cfg, dcfg = self.cfg, self.pcfg.deberta
        rows = 2 * (dcfg.position_buckets or dcfg.max_relative_positions)
        self.embedding = param(self, "embedding", normal_init(cfg.init_std), (rows, cfg.d_model),
                               ("relpos", "embed"))
        self.norm = nn.LayerNorm(
            epsilon=cfg.layer_norm_eps, dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype),
            scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), name="norm")

    def __call__(self, q_pos, k_pos):
        dcfg = self.pcfg.deberta
        span = self.span(q_pos, k_pos)
        # The Toeplitz columns' offsets j - i are static (the span is a shape): the rows are a constant.
        rows = relative_rows(-np.arange(-(span - 1), span), dcfg.position_buckets, dcfg.max_relative_positions)
        return PositionalBias.of(Disentangled(rel_embeddings=self.norm(self.embedding)[None],
                                              rel_index=jnp.asarray(rows)[None]), content_scale=3.0 ** -0.5)


MECHANISM = register(Mechanism(
    "deberta", DebertaPosition, "DeBERTa",
    "(q_i·k_j + q_i·K_r[δ] + k_j·Q_r[δ])/√(3D), δ = bucket(i − j); Q_r, K_r: the layer's own q, k projections of "
    "shared relative embeddings", inductive=True, learned=True, options=DebertaOptions,
    options_text="`deberta.position_buckets` (0: no buckets), `deberta.max_relative_positions`",
    reference="He et al., 2021",
    no_position_only_term="DeBERTa's relative terms q_i.K_r and k_j.Q_r are products with the query's and the key's "
                          "content"))
