"""Shaw et al. relative position representations: learned r^K (and r^V) per clipped offset, shared by heads."""

from __future__ import annotations

from jaxpos.attention.bias import PositionalBias
from jaxpos.initializers import normal_init
from jaxpos.positions.base import PositionMechanism, param


class ShawPosition(PositionMechanism):
    """e_ij = q_i . (k_j + r^K_{clip(j-i)}) / sqrt(D); z_i = sum_j p_ij (v_j + r^V_{clip(j-i)}). Inductive."""

    def setup(self):
        scfg = self.pcfg.shaw
        shape = (self.num_layers, 2 * scfg.clip + 1, self.cfg.head_dim)
        axes = ("layers", "relpos", "kv")
        self.rel_keys = param(self, "rel_keys", normal_init(self.cfg.init_std), shape, axes)
        if scfg.values:
            self.rel_values = param(self, "rel_values", normal_init(self.cfg.init_std), shape, axes)

    def __call__(self, q_pos, k_pos):
        return PositionalBias(rel_keys=self.rel_keys,
                              rel_values=self.rel_values if self.pcfg.shaw.values else None)
