"""The one sharding rule table: logical axis names (on every parameter and activation) -> mesh axes.

Mesh axes: `data` (pure data parallelism), `fsdp` (data parallelism with parameters sharded along `embed`),
`tensor` (heads / mlp / vocab split across devices). Nothing here assumes one device or one host.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("length", None),
    ("layers", None),
    ("relpos", None),
    ("abspos", None),
    ("abspos_k", None),
    ("rank", None),
    ("kernels", None),
)


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over all devices; data=-1 takes what the other two leave."""
    devices = list(devices if devices is not None else jax.devices())
    if data == -1:
        if len(devices) % (fsdp * tensor):
            raise ValueError(f"{len(devices)} devices cannot be split into fsdp={fsdp} x tensor={tensor}")
        data = len(devices) // (fsdp * tensor)
    if data * fsdp * tensor != len(devices):
        raise ValueError(f"mesh data={data} x fsdp={fsdp} x tensor={tensor} needs {data * fsdp * tensor} devices, "
                         f"have {len(devices)}")
    grid = np.asarray(devices, dtype=object).reshape(data, fsdp, tensor)
    axis_types = (jax.sharding.AxisType.Auto,) * 3  # classic pjit propagation, not explicit-sharding mode
    return Mesh(grid, MESH_AXES, axis_types=axis_types)


def logical_sharding(boxed_tree, mesh: Mesh, rules=LOGICAL_AXIS_RULES):
    """NamedShardings for a tree of logically partitioned values (params as returned by `init`)."""
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh, rules=LOGICAL_AXIS_RULES) -> NamedSharding:
    """Sharding of [B, ...] input arrays: the batch axis split over data and fsdp."""
    return NamedSharding(mesh, nn.logical_to_mesh_axes(("batch",), rules))


def check_batch_divisible(batch_size: int, mesh: Mesh) -> None:
    """Clear error when the global batch does not split evenly over the data-parallel devices."""
    ways = mesh.shape["data"] * mesh.shape["fsdp"]
    if batch_size % ways:
        raise ValueError(f"global batch size {batch_size} is not divisible by the {ways} data-parallel devices "
                         f"of mesh {dict(mesh.shape)}")


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
