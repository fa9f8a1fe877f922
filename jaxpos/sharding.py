"""The one sharding rule table: logical axis names (on every parameter and activation) -> mesh axes.

Mesh axes: `data` (pure data parallelism), `fsdp` (data parallelism with parameters sharded along `embed`),
`tensor` (heads / mlp / vocab split across devices). Nothing here assumes one device or one host.

Activations are constrained by the same names (`constrain` in the models, active only inside
`activation_sharding`): [B, T, d] hidden states as `HIDDEN` (batch over data x fsdp, features whole), queries,
keys and values as `HEADS`, the MLP's hidden layer as `MLP_HIDDEN`. Without them XLA's propagation follows the
fsdp-sharded weights and all-reduces full-batch activations instead of gathering the weights.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxpos.config.run import MeshConfig

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
    ("activation_embed", None),  # the features of [B, T, d] activations: whole (fsdp shards the batch there)
)

# Logical layouts of the activations the models constrain.
HIDDEN = ("batch", "length", "activation_embed")  # [B, T, d]
HEADS = ("batch", "length", "heads", "kv")  # [B, T, H, Dh]
MLP_HIDDEN = ("batch", "length", "mlp")  # [B, T, F]


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over all devices (of every process); data=-1 takes what the other two leave.

    Devices are laid out in `jax.devices()` order (process by process), so with the batch axes outermost each
    process's devices hold a contiguous block of the batch."""
    devices = list(devices if devices is not None else jax.devices())
    have = f"have {len(devices)}" + (f" ({jax.process_count()} processes x {jax.local_device_count()} devices)"
                                     if jax.process_count() > 1 else "")
    MeshConfig(data, fsdp, tensor)  # checks the sizes
    if data == -1:
        if len(devices) % (fsdp * tensor):
            raise ValueError(f"config.mesh fsdp={fsdp} x tensor={tensor} does not divide the devices: {have}")
        data = len(devices) // (fsdp * tensor)
    if data * fsdp * tensor != len(devices):
        raise ValueError(f"config.mesh data={data} x fsdp={fsdp} x tensor={tensor} needs {data * fsdp * tensor} "
                         f"devices, {have}")
    grid = np.asarray(devices, dtype=object).reshape(data, fsdp, tensor)
    axis_types = (jax.sharding.AxisType.Auto,) * 3  # classic pjit propagation, not explicit-sharding mode
    return Mesh(grid, MESH_AXES, axis_types=axis_types)


# The concrete mesh behind the bound abstract one: `per_shard` hands it to shard_map, which then also compiles
# in a jit given no shardings (with only the abstract mesh, the CPU backend fails on sdy's GlobalToLocalShape).
_BOUND_MESH: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar("jaxpos_bound_mesh", default=None)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh):
    """Binds the models' activation constraints (`constrain`) to `mesh`; elsewhere they are no-ops. Enter it
    inside the function that `jax.jit` traces."""
    token = _BOUND_MESH.set(mesh)
    try:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            yield
    finally:
        _BOUND_MESH.reset(token)


def _mesh_axes(axes) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (None, a name or a tuple of names)."""
    return tuple(a for a in (axes if isinstance(axes, tuple) else (axes,)) if a is not None)


def fit_spec(spec: PartitionSpec, shape: Sequence[int], mesh_shape) -> PartitionSpec:
    """`spec` without the splits that do not divide their axis of `shape` (those axes stay whole), so that any
    vocabulary, head count or width runs on any mesh; mesh_shape: axis name -> size."""
    def ways(axes):
        return int(np.prod([mesh_shape[a] for a in _mesh_axes(axes)]))

    entries = tuple(spec) + (None,) * (len(shape) - len(spec))
    return PartitionSpec(*(None if axes is not None and dim % ways(axes) else axes
                           for dim, axes in zip(shape, entries)))


def _same_splits(fitted: PartitionSpec, spec: PartitionSpec) -> bool:
    """Whether `fit_spec` kept every split of `spec` (it pads with None, so compare the axes `spec` names)."""
    return all(a == b for a, b in zip(fitted, spec))


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
    """Constrains activation `x` to the mesh axes of its logical `names` by this table (splits that do not divide
    left out, `fit_spec`), e.g. constrain(h, HIDDEN); a no-op outside `activation_sharding`. (The table is
    applied here rather than set with `nn.logical_axis_rules`, which would also constrain flax's flattened
    DenseGeneral kernels at their initialiser's rank and fail.)"""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = fit_spec(nn.logical_to_mesh_axes(names, LOGICAL_AXIS_RULES), x.shape, mesh.shape)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def logical_sharding(boxed_tree, mesh: Mesh, rules=LOGICAL_AXIS_RULES):
    """NamedShardings for a tree of logically partitioned values (params as returned by `init`, or their
    `jax.eval_shape`); an axis whose size the mesh does not divide stays whole, with one logged line."""
    specs = nn.get_partition_spec(boxed_tree)
    shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
    whole = []

    def fit(path, sharding, value):
        spec = fit_spec(sharding.spec, value.shape, mesh.shape)
        if not _same_splits(spec, sharding.spec):
            whole.append(f"{jax.tree_util.keystr(path)} {tuple(value.shape)}")
        return NamedSharding(mesh, spec)

    fitted = jax.tree_util.tree_map_with_path(fit, shardings, nn.unbox(boxed_tree))
    if whole:
        logging.getLogger(__name__).warning(
            f"{len(whole)} arrays stay whole along an axis that mesh {dict(mesh.shape)} does not divide (memory "
            f"per device grows; sizes that divide avoid it): {', '.join(whole[:3])}{', ...' if len(whole) > 3 else ''}")
    return fitted


def placement(boxed_tree, on: Mesh | jax.sharding.Sharding | jax.Device):
    """Shardings for a tree of logically partitioned values (params from `init` or its `jax.eval_shape`): on a
    (data, fsdp, tensor) Mesh each where the rule table puts it (as training places it), or every leaf with one
    jax.sharding.Sharding or on one jax.Device."""
    if isinstance(on, Mesh):
        if tuple(on.axis_names) != MESH_AXES:
            raise ValueError(f"mesh axes {tuple(on.axis_names)}; jaxpos places parameters on a mesh with axes "
                             f"{MESH_AXES} (jaxpos.sharding.make_mesh)")
        return logical_sharding(boxed_tree, on)
    if isinstance(on, jax.Device):
        on = jax.sharding.SingleDeviceSharding(on)
    if isinstance(on, jax.sharding.Sharding):
        return jax.tree.map(lambda _: on, nn.unbox(boxed_tree))
    raise ValueError(f"{on!r}: give a jax.sharding.Mesh, a jax.sharding.Sharding or a jax.Device")


def batch_sharding(mesh: Mesh, rules=LOGICAL_AXIS_RULES) -> NamedSharding:
    """Sharding of [B, ...] input arrays: the batch axis split over data and fsdp."""
    return NamedSharding(mesh, nn.logical_to_mesh_axes(("batch",), rules))


def check_batch_divisible(batch_size: int, mesh: Mesh, process_count: int = 1, accum_steps: int = 1) -> None:
    """Clear errors when the global batch does not split evenly over the data-parallel devices (data x fsdp),
    over the processes (each reads batch_size / processes rows), or into micro-batches on each process."""
    ways = mesh.shape["data"] * mesh.shape["fsdp"]
    if batch_size % ways:
        raise ValueError(f"global batch size {batch_size} (train.batch_size) is not divisible by the {ways} "
                         f"data-parallel devices (data x fsdp) of mesh {dict(mesh.shape)}")
    if batch_size % process_count:
        raise ValueError(f"global batch size {batch_size} (train.batch_size) is not divisible by the "
                         f"{process_count} processes, each of which reads its share of every batch")
    if batch_size % (accum_steps * process_count):
        raise ValueError(f"global batch size {batch_size} (train.batch_size) does not split into "
                         f"train.grad_accum_steps={accum_steps} micro-batches on each of {process_count} processes")


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def per_shard(fn: Callable, args: dict, in_names: dict, out_names: tuple[str | None, ...]):
    """fn(**args) run on each device's shard (`jax.shard_map`) when `activation_sharding` binds a mesh of more
    than one device, for kernels that XLA cannot partition (a Pallas call is one opaque custom call: without this,
    the partitioner would gather the whole batch onto every device). Elsewhere fn(**args) as it is.

    in_names: per argument, the logical name of each axis (None: not split); out_names: those of the one output.
    A mesh axis that does not divide some argument's axis splits nothing (e.g. 12 heads on tensor=8: the batch
    stays split, the heads whole on every device), the same for every argument and the output. Arguments split
    over no mesh axis are replicated; the gradients of replicated arguments are summed over the devices by
    shard_map's transpose (which also scales the cotangents of outputs computed redundantly).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return fn(**args)
    specs = {name: nn.logical_to_mesh_axes(in_names[name], LOGICAL_AXIS_RULES) for name in args}
    out_spec = nn.logical_to_mesh_axes(out_names, LOGICAL_AXIS_RULES)
    unfit = {axis for name, x in args.items()
             for fitted, axes in zip(fit_spec(specs[name], x.shape, mesh.shape), specs[name])
             if fitted != axes for axis in _mesh_axes(axes)}
    specs = {name: _without(spec, unfit) for name, spec in specs.items()}
    out_spec = _without(out_spec, unfit)
    if not any(_mesh_axes(axes) for spec in (*specs.values(), out_spec) for axes in spec):
        return fn(**args)
    bound = _BOUND_MESH.get()
    if bound is not None and bound.abstract_mesh == mesh:
        mesh = bound
    # check_vma=False: a Pallas call carries no varying-manual-axes types.
    return jax.shard_map(lambda kw: fn(**kw), mesh=mesh, in_specs=(specs,), out_specs=out_spec,
                         check_vma=False)(args)


def _without(spec: PartitionSpec, drop: set[str]) -> PartitionSpec:
    """`spec` with the mesh axes in `drop` removed from every entry."""
    def keep(axes):
        kept = tuple(a for a in _mesh_axes(axes) if a not in drop)
        return None if not kept else kept if isinstance(axes, tuple) else kept[0]
    return PartitionSpec(*(keep(axes) for axes in spec))


# --- global batches from each process's rows ---------------------------------------------------------------

def make_global_batch(local: dict, sharding: NamedSharding) -> dict:
    """Global arrays [B, ...] from each process's rows: process p of P gives rows [p·B/P, (p+1)·B/P) as numpy
    arrays [B/P, ...] (the split of jaxpos.data.order.host_slice), so each process reads only its share.

    When the mesh gives each process exactly those rows (one process; or the batch axes span the processes in
    process order, as make_mesh lays them out) the arrays are assembled in place. Otherwise (e.g. tensor
    parallelism across hosts, where every process needs every row) they are assembled split by process and
    then resharded on the devices, which moves rows between processes."""
    count, index = jax.process_count(), jax.process_index()
    if count == 1:  # every row is this process's: one batched transfer for the whole batch
        return jax.device_put({key: np.asarray(value) for key, value in local.items()}, sharding)
    out = {}
    for key, value in local.items():
        value = np.asarray(value)
        shape = (value.shape[0] * count,) + value.shape[1:]
        if _holds_rows(sharding, shape[0], index * value.shape[0], (index + 1) * value.shape[0]):
            out[key] = jax.make_array_from_process_local_data(sharding, value, shape)
        else:
            by_process = jax.make_array_from_process_local_data(_process_sharding(sharding.mesh), value, shape)
            out[key] = _reshard(sharding)(by_process)
    return out


@functools.lru_cache(maxsize=None)
def _holds_rows(sharding: NamedSharding, rows: int, start: int, stop: int) -> bool:
    """Whether this process's devices hold exactly rows [start, stop) of a [rows, ...] array."""
    held = np.zeros(rows, bool)
    for index in sharding.addressable_devices_indices_map((rows,)).values():
        held[index[0]] = True
    return bool(held[start:stop].all()) and int(held.sum()) == stop - start


@functools.lru_cache(maxsize=None)
def _process_sharding(mesh) -> NamedSharding:
    """Rows split over processes in process order, replicated over each process's devices."""
    devices = sorted(mesh.devices.flat, key=lambda d: (d.process_index, d.id))
    grid = np.asarray(devices, dtype=object).reshape(jax.process_count(), -1)
    return NamedSharding(Mesh(grid, ("process", "local")), PartitionSpec("process"))


@functools.lru_cache(maxsize=None)
def _reshard(sharding: NamedSharding) -> Callable:
    return jax.jit(lambda x: x, out_shardings=sharding)
