"""The layouts of a stack's layer parameters: unscanned (`layer_0` ... `layer_{L-1}`, one subtree a layer) and
scanned (`model.scan_layers`). A scan over single layers stacks every leaf on a leading layer axis under
`layers/layer`; a scan over groups of layers (`ModelConfig.scan_group`: local and global layers, a first layer
without its attention norm) stacks group position j's leaves under `groups/layer_{s+j}`, named after the first
group's layers (s: the layers before the scan, which stay `layer_i`, as do those after the last whole group).
Conversions both ways for any tree that holds them (parameters, gradients, optimiser moments), so a run trained in
one layout reads as the other."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp

SCANNED, LAYER = "layers", "layer"  # the scan over single layers: its module name and its body's
GROUPS = "groups"  # the scan over groups of layers
_UNSCANNED = re.compile(r"layer_(\d+)$")


def scan_names(group: tuple[int, int]) -> tuple[str, list[str]]:
    """(the scan's module name, its body's layer names) for `group` = (start, size) (`ModelConfig.scan_group`):
    layers/layer for single layers from layer 0, the plain layout; otherwise groups/layer_{start+j}."""
    start, size = group
    if (start, size) == (0, 1):
        return SCANNED, [LAYER]
    return GROUPS, [f"layer_{start + j}" for j in range(size)]


def to_unscanned(tree):
    """`tree` with every scanned stack ({"layers": {"layer": stacked}} or {"groups": {layer_k: stacked}}) split
    into layer_0 ... layer_{L-1}; the group size is the number of layers in a group."""
    if not isinstance(tree, dict):
        return tree
    out = {}
    for key, value in tree.items():
        if key == SCANNED and isinstance(value, dict) and set(value) == {LAYER}:
            key, value = GROUPS, {"layer_0": value[LAYER]}  # single layers from 0: groups of one
        if key == GROUPS and isinstance(value, dict) and value and all(map(_UNSCANNED.match, value)):
            for name, stacked in value.items():
                first = int(_UNSCANNED.match(name).group(1))
                stacked = to_unscanned(stacked)
                count = jax.tree.leaves(stacked)[0].shape[0]
                out.update({f"layer_{first + i * len(value)}": jax.tree.map(lambda x, i=i: x[i], stacked)
                            for i in range(count)})
        else:
            out[key] = to_unscanned(value)
    return out


def to_scanned(tree, group: tuple[int, int] = (0, 1)):
    """`tree` with every unscanned stack (layer_0 ... layer_{L-1}) in the scanned layout of `group` = (start,
    size) (`ModelConfig.scan_group`): (0, 1) stacks every layer into {"layers": {"layer": ...}}; otherwise layers
    start + i * size + j of the whole groups go to {"groups": {"layer_{start+j}": stacked over i}}."""
    if not isinstance(tree, dict):
        return tree
    layers = sorted((int(m.group(1)), key) for key in tree if (m := _UNSCANNED.match(key)))
    out = {key: to_scanned(value, group) for key, value in tree.items() if not _UNSCANNED.match(key)}
    if not layers:
        return out
    if [i for i, _ in layers] != list(range(len(layers))):
        raise ValueError(f"layers {[i for i, _ in layers]} are not 0 .. {len(layers) - 1}: no stack to scan")
    start, size = group
    count = max(0, (len(layers) - start) // size)
    stacked = range(start, start + count * size)
    out.update({key: to_scanned(tree[key], group) for i, key in layers if i not in stacked})

    def stack(depths):
        return jax.tree.map(lambda *xs: jnp.stack(xs), *(to_scanned(tree[f"layer_{i}"], group) for i in depths))

    if count:
        outer, inner = scan_names(group)
        out[outer] = {name: stack(range(start + j, start + count * size, size)) for j, name in enumerate(inner)}
    return out


def relayout(tree, scanned: bool, group: tuple[int, int] = (0, 1)):
    """Every parameter-like subtree of `tree` (a training state: parameters, optimiser moments, gradients) in the
    scanned (True; `group` as `to_scanned` takes it) or unscanned layout; arrays outside them unchanged."""
    convert = (lambda t: to_scanned(t, group)) if scanned else to_unscanned
    return jax.tree.map(convert, tree, is_leaf=lambda x: isinstance(x, dict))
