"""The two layouts of a stack's layer parameters: unscanned (`layer_0` ... `layer_{L-1}`, one subtree a layer) and
scanned (`model.scan_layers`: `layers/layer`, every leaf stacked on a leading layer axis). Conversions both ways
for any tree that holds them (parameters, gradients, optimiser moments), so a run trained in one layout reads as
the other."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp

SCANNED, LAYER = "layers", "layer"  # the scan's module name and its body's
_UNSCANNED = re.compile(r"layer_(\d+)$")


def to_unscanned(tree):
    """`tree` with every scanned stack ({"layers": {"layer": stacked}}) split into layer_0 ... layer_{L-1}."""
    if not isinstance(tree, dict):
        return tree
    out = {}
    for key, value in tree.items():
        if key == SCANNED and isinstance(value, dict) and set(value) == {LAYER}:
            stacked = to_unscanned(value[LAYER])
            count = jax.tree.leaves(stacked)[0].shape[0]
            out.update({f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(count)})
        else:
            out[key] = to_unscanned(value)
    return out


def to_scanned(tree):
    """`tree` with every unscanned stack (layer_0 ... layer_{L-1}) stacked into {"layers": {"layer": ...}}."""
    if not isinstance(tree, dict):
        return tree
    layers = sorted((int(m.group(1)), key) for key in tree if (m := _UNSCANNED.match(key)))
    out = {key: to_scanned(value) for key, value in tree.items() if not _UNSCANNED.match(key)}
    if layers:
        if [i for i, _ in layers] != list(range(len(layers))):
            raise ValueError(f"layers {[i for i, _ in layers]} are not 0 .. {len(layers) - 1}: no stack to scan")
        out[SCANNED] = {LAYER: jax.tree.map(lambda *xs: jnp.stack(xs), *(to_scanned(tree[key]) for _, key in layers))}
    return out


def relayout(tree, scanned: bool):
    """Every parameter-like subtree of `tree` (a training state: parameters, optimiser moments, gradients) in the
    scanned (True) or unscanned layout; arrays outside them unchanged."""
    convert = to_scanned if scanned else to_unscanned
    return jax.tree.map(convert, tree, is_leaf=lambda x: isinstance(x, dict))
