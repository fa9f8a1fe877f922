"""Figures in the papers' styles, written as PNG files (matplotlib, Agg backend)."""

from __future__ import annotations

import math
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from jaxpos.positions.tisa import tisa_scores


def plot_tisa_scores(params: dict, max_offset: int, path: str, profiles: np.ndarray | None = None,
                     titles: list[str] | None = None, suptitle: str = "TISA positional scores per head") -> str:
    """TISA scoring functions f_h(k) of every head, one panel per layer (TISA Fig. 3 style).

    params: a, b, c of shape [L', H', S]; offsets k in [-(max_offset-1), max_offset-1]. `profiles`
    [L, H, 2*max_offset-1] (e.g. F-hat_P of an absolute model) are drawn dashed behind the fitted functions.
    `titles`: one per panel (default: the layer, or "shared across layers" for one panel).
    """
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
        ax.set_title(titles[layer] if titles else f"layer {layer}" if layers > 1 else "shared across layers",
                     fontsize=9)
        ax.set_xlabel("offset j − i")
    axes[0][0].set_ylabel("f(j − i)")
    if heads <= 12:
        axes[0][0].legend(fontsize=6, ncol=2)
    for extra in range(layers, rows * cols):
        axes[extra // cols][extra % cols].axis("off")
    fig.suptitle(textwrap.fill(suptitle, 48 * cols), fontsize=10)  # narrow one-panel figures wrap the title
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_figure(fig, path: str) -> str:
    """Lays out FIG, writes it to PATH (a PNG at 110 dpi) and closes it; returns PATH."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _grid(count: int, max_cols: int = 4, size=(3.2, 3.0)):
    cols = min(count, max_cols)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False)
    for extra in range(count, rows * cols):
        axes[extra // cols][extra % cols].axis("off")
    return fig, [axes[i // cols][i % cols] for i in range(count)]


def plot_position_gram(gram: np.ndarray, r2: float, path: str, title: str = "") -> str:
    """Heatmap of P = E_P E_P^T [n, n] with its Toeplitz R^2 (TISA App. B)."""
    fig, ax = plt.subplots(figsize=(4.6, 4.0))
    image = ax.imshow(gram, cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046)
    ax.set_xlabel("position j")
    ax.set_ylabel("position i")
    ax.set_title(f"{title + ': ' if title else ''}$E_P E_P^T$, Toeplitz $R^2$ = {r2:.3f}", fontsize=9)
    return save_figure(fig, path)


def plot_positional_matrices(matrices: np.ndarray, titles: list[str], path: str, suptitle: str = "") -> str:
    """Positional weight matrices [K, n, n] (identical-word probing, Chen et al. Fig. 1-2), one panel each,
    titled with their locality and symmetry."""
    fig, axes = _grid(len(matrices))
    for ax, matrix, title in zip(axes, matrices, titles):
        image = ax.imshow(matrix, cmap="Blues", interpolation="nearest")
        fig.colorbar(image, ax=ax, fraction=0.046)
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    return save_figure(fig, path)


def plot_ranks(logit_rank: np.ndarray, head_dim: int, length: int, path: str,
               positional_rank: np.ndarray | None = None, positional_label: str = "") -> str:
    """Numerical rank of the attention logits per layer and head [L, H] (DIET Fig. 2), beside the rank of the
    positional attention matrices [L', H'] (DIET Fig. 8) when the model has them; the head dim D marked."""
    panels = 2 if positional_rank is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.6), squeeze=False)
    for ax, ranks, title in zip(axes[0], (logit_rank, positional_rank),
                                (f"attention logits (T = {length})", positional_label or "positional logits")):
        layers, heads = ranks.shape
        width = 0.8 / heads
        for h in range(heads):
            ax.bar(np.arange(layers) + (h - (heads - 1) / 2) * width, ranks[:, h], width, color=plt.cm.viridis(h / max(heads - 1, 1)))
        ax.axhline(head_dim, color="red", ls="--", lw=1, label=f"head dim D = {head_dim}")
        ax.axhline(length, color="grey", ls=":", lw=1, label=f"T = {length}")
        ax.set_xticks(np.arange(layers))
        ax.set_xlabel("layer (bars: heads)")
        ax.set_ylabel("numerical rank")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_term_importance(importance: np.ndarray, path: str, terms=("i", "h", "f", "c"), title: str = "") -> str:
    """Muppet Fig. 3: mean importance mu of each term of e = i + h + f + c across layers [L+1, 4]."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    labels = dict(i="i (input embeddings)", h="h (attention)", f="f (feed-forward)", c="c (biases, LN shifts)")
    for k, term in enumerate(terms):
        ax.plot(np.arange(len(importance)), importance[:, k], marker="o", label=labels.get(term, term))
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_ylabel(r"importance $\mu(e, t)$")
    ax.set_xticks(np.arange(len(importance)))
    ax.set_title(title or "additive decomposition: term importance", fontsize=9)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_effective_attention(raw: np.ndarray, effective: np.ndarray, lengths, correlation: np.ndarray,
                             head_dim: int, path: str, example: str = "") -> str:
    """Brunner et al. Fig. 1: raw vs effective attention of one head [T, T] each, and the Pearson correlation
    of the two against sequence length, per layer (correlation [len(lengths), L])."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, matrix, title in zip(axes[:2], (raw, effective), ("raw attention A", r"effective attention $A^\perp$")):
        bound = np.abs(matrix).max()
        image = ax.imshow(matrix, cmap="RdBu_r", vmin=-bound, vmax=bound, interpolation="nearest")
        fig.colorbar(image, ax=ax, fraction=0.046)
        ax.set_title(f"{title}{' (' + example + ')' if example else ''}", fontsize=8)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    ax = axes[2]
    correlation = np.asarray(correlation, float)
    colors = plt.cm.viridis(np.linspace(0, 1, correlation.shape[1]))
    for layer in range(correlation.shape[1]):
        ax.plot(lengths, correlation[:, layer], marker="o", color=colors[layer], lw=1, label=f"layer {layer + 1}")
    ax.plot(lengths, np.nanmean(correlation, axis=1), color="black", lw=2, label="mean")
    ax.axvline(head_dim, color="red", ls="--", lw=1, label=f"head dim D = {head_dim}")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("Pearson r (raw, effective)")
    ax.set_title("correlation of raw and effective attention", fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    return save_figure(fig, path)


def plot_identifiability(rates: dict, path: str, title: str = "") -> str:
    """Brunner et al. Fig. 2a: token identifiability rate per layer for each probe ({kind: [L+1]})."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for kind, values in rates.items():
        ax.plot(np.arange(len(values)), values, marker="o", label=kind)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_ylabel("identifiability rate (test)")
    ax.set_title(title or "token identifiability", fontsize=9)
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def plot_attribution(by_distance: np.ndarray, self_share: np.ndarray, top_share: np.ndarray, path: str) -> str:
    """Brunner et al. Fig. 3-4: hidden token attribution. Contribution by neighbour distance per layer
    (by_distance [L, T]) and, per layer, the token's own share and how often it is the top contributor."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    colors = plt.cm.viridis(np.linspace(0, 1, len(by_distance)))
    for layer, row in enumerate(by_distance):
        axes[0].plot(np.arange(len(row)), row, marker=".", color=colors[layer], label=f"layer {layer + 1}")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("distance |i - j| of the input token")
    axes[0].set_ylabel("mean contribution")
    axes[0].set_title("contribution by neighbour distance", fontsize=9)
    axes[0].legend(fontsize=6, ncol=2)
    layers = np.arange(1, len(self_share) + 1)
    axes[1].plot(layers, self_share, marker="o", label="own token's share")
    axes[1].plot(layers, top_share, marker="s", label="own token is top contributor")
    axes[1].set_ylim(0, 1.02)
    axes[1].set_xticks(layers)
    axes[1].set_xlabel("layer")
    axes[1].set_title("the token's own contribution", fontsize=9)
    axes[1].legend(fontsize=7)
    return save_figure(fig, path)


def plot_over_training(steps, series: dict, path: str, head_dim: int | None = None, title: str = "") -> str:
    """Diagnostics against the training step (`jaxpos analyze --checkpoints`): Toeplitz R^2 of E_P E_P^T,
    identical-word locality and symmetry, attention logit rank (mean, max; positional rank), and the Muppet
    importance of each term at the last layer. `series` maps names (`over_training.headline`) to one value per
    step (None where a diagnostic did not apply); a panel whose values are all None is left out."""
    def present(name):
        values = series.get(name) or []
        return any(v is not None for v in values)

    def line(ax, name, label, **kwargs):
        values = [np.nan if v is None else v for v in series[name]]
        ax.plot(steps, values, marker="o", label=label, **kwargs)

    panels = []
    if present("toeplitz_r2"):
        panels.append(("Toeplitz $R^2$ of $E_P E_P^T$", [("toeplitz_r2", "$R^2$")]))
    if present("locality") or present("symmetry"):
        panels.append(("identical-word attention", [("locality", "locality"), ("symmetry", "symmetry")]))
    if present("logit_rank_mean"):
        panels.append(("numerical rank", [("logit_rank_mean", "logits, mean"), ("logit_rank_max", "logits, max"),
                                          ("positional_rank_mean", "positional logits, mean")]))
    if present("importance_last"):
        panels.append(("Muppet importance, last layer", "importance"))
    if not panels:
        raise ValueError("no diagnostic to draw over training: every series is empty")
    fig, axes = _grid(len(panels), max_cols=4, size=(3.6, 3.0))
    for ax, (name, lines) in zip(axes, panels):
        if lines == "importance":
            values = np.asarray([[np.nan] * 4 if v is None else v for v in series["importance_last"]], float)
            for k, term in enumerate(("i (input)", "h (attention)", "f (feed-forward)", "c (biases)")):
                ax.plot(steps, values[:, k], marker="o", label=term)
        else:
            for key, label in lines:
                if present(key):
                    line(ax, key, label)
            if name == "numerical rank" and head_dim:
                ax.axhline(head_dim, color="red", ls="--", lw=1, label=f"D = {head_dim}")
        ax.set_xlabel("training step")
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)
