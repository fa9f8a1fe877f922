"""Shaw et al. relative position representations: learned r^K (and r^V) per clipped offset, shared by heads."""

from __future__ import annotations

import dataclasses

from jaxpos.attention.bias import PositionalBias, ShawRelative
from jaxpos.config.checks import check_count
from jaxpos.config.position import MechanismOptions
from jaxpos.initializers import normal_init
from jaxpos.positions.base import PositionMechanism, param
from jaxpos.positions.registry import Mechanism, register


@dataclasses.dataclass(frozen=True)
class ShawOptions(MechanismOptions):
    clip: int = 16  # k: offsets are clipped to [-k, k]
    values: bool = True  # also add r^V to the values

    def check(self, model) -> None:
        check_count("position.shaw.clip", self.clip, 1)
        if not isinstance(self.values, bool):
            raise ValueError(f"position.shaw.values={self.values!r} must be true or false")


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
        return PositionalBias.of(ShawRelative(rel_keys=self.rel_keys,
                                              rel_values=self.rel_values if self.pcfg.shaw.values else None))


MECHANISM = register(Mechanism(
    "shaw", ShawPosition, "Shaw et al.", "r^K, r^V per clipped offset", inductive=True, learned=True,
    options=ShawOptions, options_text="`shaw.clip`, `shaw.values`", reference="Shaw et al., 2018",
    no_position_only_term="Shaw's relative term q.r^K is a product with the query's content"))
