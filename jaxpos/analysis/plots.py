"""Figures in the papers' styles, written as PNG files (matplotlib, Agg backend)."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_tisa_scores(params: dict, max_offset: int, path: str, profiles: np.ndarray | None = None) -> str:
    """TISA scoring functions f_h(k) of every head, one panel per layer (TISA Fig. 3 style).

    params: a, b, c of shape [L', H', S]; offsets k in [-(max_offset-1), max_offset-1]. `profiles`
    [L, H, 2*max_offset-1] (e.g. F-hat_P of an absolute model) are drawn dashed behind the fitted functions.
    """
    from jaxpos.positions.tisa import tisa_scores

    k = np.arange(-(max_offset - 1), max_offset)
    scores = np.asarray(tisa_scores(k, params["a"], params["b"], params["c"]))  # [L', H', K]
    layers, heads = scores.shape[:2]
    cols = min(layers, 4)
    rows = math.ceil(layers / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False, sharex=True)
    colors = plt.cm.viridis(np.linspace(0, 1, heads))
    for layer in range(layers):
        ax = axes[layer // cols][layer % cols]
        for h in range(heads):
            if profiles is not None:
                ax.plot(k, profiles[layer, h], color=colors[h], lw=0.8, ls="--", alpha=0.6)
            ax.plot(k, scores[layer, h], color=colors[h], lw=1.2, label=f"head {h}")
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_title(f"layer {layer}" if layers > 1 else "shared across layers")
        ax.set_xlabel("offset j − i")
    axes[0][0].set_ylabel("f(j − i)")
    if heads <= 12:
        axes[0][0].legend(fontsize=6, ncol=2)
    for extra in range(layers, rows * cols):
        axes[extra // cols][extra % cols].axis("off")
    fig.suptitle("TISA positional scores per head")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
