"""Figures in the papers' styles, written as PNG files (matplotlib, Agg backend).

Each figure has a function that returns the matplotlib Figure (`*_figure`, what the tests inspect) and a thin
`plot_*` wrapper that saves it. Layers are numbered one way in every figure (`layer_label`): "layer 1" is the first
Transformer layer, and the embedding output, where a series starts with it, is "embeddings", never a number.
"""

from __future__ import annotations

import math
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.cm import ScalarMappable  # noqa: E402
from matplotlib.colors import BoundaryNorm, ListedColormap  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from jaxpos.positions.tisa import tisa_scores

LAYER_AXIS_LABEL = "layer (1 = first)"
EMBEDDINGS_LABEL = "embeddings"
# Relative distances within ±30 hold nearly all of a trained TISA kernel's shape; the full span is ±(T-1).
TISA_ZOOM = 30
TISA_SUPTITLE = "TISA positional scores per head"


def layer_number(index: int) -> int:
    """The number every figure shows for the Transformer layer at 0-based `index`: the first layer is 1."""
    return int(index) + 1


def layer_label(index: int) -> str:
    """'layer 1' for the first Transformer layer (0-based `index` 0): panel titles and legend entries."""
    return f"layer {layer_number(index)}"


def hidden_state_label(index: int) -> str:
    """Tick label of hidden state `index` in a series over the [L+1] states: 'embeddings' for 0 (the embedding
    output), else the number of the layer that produced the state."""
    return EMBEDDINGS_LABEL if index == 0 else str(layer_number(index - 1))


def head_label(index: int) -> str:
    """'head 1' for the first attention head (0-based `index` 0)."""
    return f"head {int(index) + 1}"


def head_colors(heads: int) -> np.ndarray:
    """[heads, 4] RGBA: the colour of each head in every per-head figure (viridis, first to last)."""
    return plt.cm.viridis(np.linspace(0, 1, heads))


def set_layer_axis(ax, count: int, *, with_embeddings: bool = False) -> None:
    """x ticks at 0..count-1 labelled with layer numbers, the axis label stating the convention. With
    `with_embeddings` the series has [L+1] values and its first is the embedding output, labelled 'embeddings'."""
    labels = [hidden_state_label(i) if with_embeddings else str(layer_number(i)) for i in range(count)]
    ax.set_xticks(np.arange(count), labels)
    if with_embeddings and count > 5:  # the one long tick label, slanted so that it does not run into layer 1's
        ax.get_xticklabels()[0].set(rotation=30, ha="right")
    ax.set_xlabel(LAYER_AXIS_LABEL)


def add_head_colorbar(fig, ax, heads: int):
    """A colour key for bars or lines coloured by `head_colors(heads)`: one discrete colour per head, ticked with
    the head numbers 1..H (every one up to 16 heads), beside `ax`."""
    norm = BoundaryNorm(np.arange(heads + 1) + 0.5, heads)
    colorbar = fig.colorbar(ScalarMappable(norm, ListedColormap(head_colors(heads))), ax=ax, fraction=0.05, pad=0.03)
    ticks = np.arange(1, heads + 1) if heads <= 16 else np.unique(np.linspace(1, heads, 9).round().astype(int))
    colorbar.set_ticks(ticks, labels=[str(t) for t in ticks])
    colorbar.ax.tick_params(labelsize=7)
    colorbar.set_label("head (bar colour)", fontsize=8)
    return colorbar


def draw_rank_bounds(ax, head_dim: int | None, length: int | None) -> None:
    """Horizontal lines at the two rank bounds, each labelled: the head dim D (rank(Q Kᵀ) ≤ D) and the analysis
    length T (any T x T matrix has rank ≤ T). When T == D the labels say so: a rank near it is the bound. Call it
    after drawing the ranks: the y axis then starts at 0, with room above the bounds for the legend."""
    top = max(ax.dataLim.y1 if ax.has_data() else 0, head_dim or 0, length or 0)
    same = bool(head_dim) and head_dim == length
    if head_dim:
        ax.axhline(head_dim, color="red", ls="--", lw=1,
                   label=f"head dim D = {head_dim}{' = T' if same else ''}: rank(QKᵀ) ≤ D")
    if length:
        ax.axhline(length, color="grey", ls=":", lw=1.4,
                   label=f"analysis length T = {length}{' = D' if same else ''}: rank ≤ T")
    if top > 0:  # ranks against 0, not a zoom on their last digit; the legend above the highest bar
        ax.set_ylim(0, 1.4 * top)


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


def tisa_scores_figure(params: dict, max_offset: int, profiles: np.ndarray | None = None,
                       titles: list[str] | None = None, suptitle: str = TISA_SUPTITLE, step: int | None = None,
                       zoom: int | None = TISA_ZOOM):
    """TISA scoring functions f_h(k) of every head, one panel per layer (TISA Fig. 3 style); returns the Figure.

    params: a, b, c of shape [L', H', S]; offsets k in [-(max_offset-1), max_offset-1]. `profiles`
    [L', H', 2*max_offset-1] (e.g. F-hat_P of an absolute model) are drawn dashed behind the fitted functions.
    `titles`: one per layer (default: its `layer_label`, or "shared across layers" for one panel). Beside each
    full panel, one zoomed to |k| ≤ `zoom` (none when that is the full span or `zoom` is None), titled with the
    full panel's title up to its first ':'. `step`: the training step, added to the title.
    """
    full_span = max_offset - 1
    k = np.arange(-full_span, full_span + 1)
    scores = np.asarray(tisa_scores(k, params["a"], params["b"], params["c"]))  # [L', H', K]
    layers, heads = scores.shape[:2]
    spans = [full_span] + ([zoom] if zoom and zoom < full_span else [])
    layers_per_row = min(layers, 4 // len(spans))
    cols = layers_per_row * len(spans)
    rows = math.ceil(layers / layers_per_row)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    panels = [axes[i // cols][i % cols] for i in range(rows * cols)]
    colors = head_colors(heads)
    for layer in range(layers):
        name = titles[layer] if titles else layer_label(layer) if layers > 1 else "shared across layers"
        for view, span in enumerate(spans):
            ax = panels[layer * len(spans) + view]
            shown = np.abs(k) <= span  # only the drawn offsets, so that the y range fits what a zoom shows
            for h in range(heads):
                if profiles is not None:
                    ax.plot(k[shown], profiles[layer, h][shown], color=colors[h], lw=0.8, ls="--", alpha=0.6)
                ax.plot(k[shown], scores[layer, h][shown], color=colors[h], lw=1.2, label=head_label(h))
            ax.axvline(0, color="grey", lw=0.5)
            ax.set_xlim(-span, span)
            title = name if span == full_span else f"{name.split(':')[0]}, zoom |j − i| ≤ {span}"
            ax.set_title(textwrap.fill(title, 60), fontsize=9)
            ax.set_xlabel("offset j − i")
    panels[0].set_ylabel("f(j − i)")
    if heads <= 12:
        panels[0].legend(fontsize=6, ncol=2)
    for ax in panels[layers * len(spans):]:
        ax.axis("off")
    if step is not None:
        suptitle = f"{suptitle} at step {step}"
    fig.suptitle(textwrap.fill(suptitle, 48 * cols), fontsize=10)  # narrow one-panel figures wrap the title
    return fig


def plot_tisa_scores(params: dict, max_offset: int, path: str, profiles: np.ndarray | None = None,
                     titles: list[str] | None = None, suptitle: str = TISA_SUPTITLE, step: int | None = None,
                     zoom: int | None = TISA_ZOOM) -> str:
    """`tisa_scores_figure` written to PATH; returns PATH."""
    return save_figure(tisa_scores_figure(params, max_offset, profiles, titles, suptitle, step, zoom), path)


def position_gram_figure(gram: np.ndarray, r2: float, title: str = ""):
    """Heatmap of P = E_P E_P^T [n, n] with its Toeplitz R^2 (TISA App. B)."""
    fig, ax = plt.subplots(figsize=(4.6, 4.0))
    image = ax.imshow(gram, cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046)
    ax.set_xlabel("position j")
    ax.set_ylabel("position i")
    ax.set_title(f"{title + ': ' if title else ''}$E_P E_P^T$, Toeplitz $R^2$ = {r2:.3f}", fontsize=9)
    return fig


def plot_position_gram(gram: np.ndarray, r2: float, path: str, title: str = "") -> str:
    """`position_gram_figure` written to PATH; returns PATH."""
    return save_figure(position_gram_figure(gram, r2, title), path)


def positional_matrices_figure(matrices: np.ndarray, titles: list[str], suptitle: str = ""):
    """Positional weight matrices [K, n, n] (identical-word probing, Chen et al. Fig. 1-2), one panel each,
    titled with their locality and symmetry (name layers with `layer_label`)."""
    fig, axes = _grid(len(matrices))
    for ax, matrix, title in zip(axes, matrices, titles):
        image = ax.imshow(matrix, cmap="Blues", interpolation="nearest")
        fig.colorbar(image, ax=ax, fraction=0.046)
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    return fig


def plot_positional_matrices(matrices: np.ndarray, titles: list[str], path: str, suptitle: str = "") -> str:
    """`positional_matrices_figure` written to PATH; returns PATH."""
    return save_figure(positional_matrices_figure(matrices, titles, suptitle), path)


def ranks_figure(logit_rank: np.ndarray, head_dim: int, length: int, positional_rank: np.ndarray | None = None,
                 positional_label: str = ""):
    """Numerical rank of the attention logits per layer and head [L, H] (DIET Fig. 2), beside the rank of the
    positional attention matrices [L', H'] (DIET Fig. 8) when the model has them: one bar per head, coloured
    as the head colour key says; the bounds D and T marked."""
    panels = [(np.asarray(logit_rank, float), f"attention logits (T = {length})")]
    if positional_rank is not None:
        panels.append((np.asarray(positional_rank, float), positional_label or "positional logits"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 3.6), squeeze=False)
    head_counts = [ranks.shape[1] for ranks, _ in panels]
    for index, (ax, (ranks, title)) in enumerate(zip(axes[0], panels)):
        layers, heads = ranks.shape
        width = 0.8 / heads
        colors = head_colors(heads)
        for h in range(heads):
            ax.bar(np.arange(layers) + (h - (heads - 1) / 2) * width, ranks[:, h], width, color=colors[h])
        draw_rank_bounds(ax, head_dim, length)
        set_layer_axis(ax, layers)
        ax.set_ylabel("numerical rank")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
        # One key for all panels when they share the head count (the last panel's), else one per panel.
        if len(set(head_counts)) > 1 or index == len(panels) - 1:
            add_head_colorbar(fig, ax, heads)
    return fig


def plot_ranks(logit_rank: np.ndarray, head_dim: int, length: int, path: str,
               positional_rank: np.ndarray | None = None, positional_label: str = "") -> str:
    """`ranks_figure` written to PATH; returns PATH."""
    return save_figure(ranks_figure(logit_rank, head_dim, length, positional_rank, positional_label), path)


def term_importance_figure(importance: np.ndarray, terms=("i", "h", "f", "c"), title: str = ""):
    """Muppet Fig. 3: mean importance mu of each term of e = i + h + f + c across the hidden states [L+1, 4]
    (the embedding output first, then each layer's)."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    labels = dict(i="i (input embeddings)", h="h (attention)", f="f (feed-forward)", c="c (biases, LN shifts)")
    for k, term in enumerate(terms):
        ax.plot(np.arange(len(importance)), importance[:, k], marker="o", label=labels.get(term, term))
    ax.axhline(0, color="grey", lw=0.5)
    set_layer_axis(ax, len(importance), with_embeddings=True)
    ax.set_ylabel(r"importance $\mu(e, t)$")
    ax.set_title(title or "additive decomposition: term importance", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def plot_term_importance(importance: np.ndarray, path: str, terms=("i", "h", "f", "c"), title: str = "") -> str:
    """`term_importance_figure` written to PATH; returns PATH."""
    return save_figure(term_importance_figure(importance, terms, title), path)


def effective_attention_figure(raw: np.ndarray, effective: np.ndarray, lengths, correlation: np.ndarray,
                               head_dim: int, example: str = ""):
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
        ax.plot(lengths, correlation[:, layer], marker="o", color=colors[layer], lw=1, label=layer_label(layer))
    ax.plot(lengths, np.nanmean(correlation, axis=1), color="black", lw=2, label="mean")
    ax.axvline(head_dim, color="red", ls="--", lw=1, label=f"head dim D = {head_dim}")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("Pearson r (raw, effective)")
    ax.set_title("correlation of raw and effective attention", fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    return fig


def plot_effective_attention(raw: np.ndarray, effective: np.ndarray, lengths, correlation: np.ndarray,
                             head_dim: int, path: str, example: str = "") -> str:
    """`effective_attention_figure` written to PATH; returns PATH."""
    return save_figure(effective_attention_figure(raw, effective, lengths, correlation, head_dim, example), path)


def identifiability_figure(rates: dict, title: str = ""):
    """Brunner et al. Fig. 2a: token identifiability rate per hidden state for each probe ({kind: [L+1]}, the
    embedding output first)."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for kind, values in rates.items():
        ax.plot(np.arange(len(values)), values, marker="o", label=kind)
    ax.set_ylim(0, 1.02)
    set_layer_axis(ax, max((len(values) for values in rates.values()), default=0), with_embeddings=True)
    ax.set_ylabel("identifiability rate (test)")
    ax.set_title(title or "token identifiability", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def plot_identifiability(rates: dict, path: str, title: str = "") -> str:
    """`identifiability_figure` written to PATH; returns PATH."""
    return save_figure(identifiability_figure(rates, title), path)


def attribution_figure(by_distance: np.ndarray, self_share: np.ndarray, top_share: np.ndarray):
    """Brunner et al. Fig. 3-4: hidden token attribution. Contribution by neighbour distance per layer
    (by_distance [L, T]) and, per layer, the token's own share and how often it is the top contributor ([L])."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    colors = plt.cm.viridis(np.linspace(0, 1, len(by_distance)))
    for layer, row in enumerate(by_distance):
        axes[0].plot(np.arange(len(row)), row, marker=".", color=colors[layer], label=layer_label(layer))
    axes[0].set_yscale("log")
    axes[0].set_xlabel("distance |i - j| of the input token")
    axes[0].set_ylabel("mean contribution")
    axes[0].set_title("contribution by neighbour distance", fontsize=9)
    axes[0].legend(fontsize=6, ncol=2)
    layers = np.arange(len(self_share))
    axes[1].plot(layers, self_share, marker="o", label="own token's share")
    axes[1].plot(layers, top_share, marker="s", label="own token is top contributor")
    axes[1].set_ylim(0, 1.02)
    set_layer_axis(axes[1], len(self_share))
    axes[1].set_title("the token's own contribution", fontsize=9)
    axes[1].legend(fontsize=7)
    return fig


def plot_attribution(by_distance: np.ndarray, self_share: np.ndarray, top_share: np.ndarray, path: str) -> str:
    """`attribution_figure` written to PATH; returns PATH."""
    return save_figure(attribution_figure(by_distance, self_share, top_share), path)


def sinks_figure(measures: dict, title: str = ""):
    """Where attention sinks: per layer, the mean over heads of the weight on the first token, on [SEP], on the
    most-attended key and on a learned sink, against the uniform floor; and the first token's weight per layer and
    head. `measures`: {name: [L, H]} (jaxpos.analysis.sinks)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    layers = np.arange(measures["first"].shape[0])
    labels = dict(first="first token", sep="[SEP]", top="most-attended key", learned="learned sink",
                  uniform="uniform (1/n)")
    for name, label in labels.items():
        values = np.asarray(measures[name], float)
        if np.isfinite(values).any() and (name != "learned" or np.nanmax(values) > 0):
            axes[0].plot(layers, np.nanmean(values, axis=1), marker="o", label=label,
                         linestyle="--" if name == "uniform" else "-")
    axes[0].set_ylim(0, 1.02)
    axes[0].set_ylabel("mean attention weight")
    set_layer_axis(axes[0], len(layers))
    axes[0].legend(fontsize=7)
    axes[0].set_title("attention drawn, mean over heads", fontsize=9)
    image = axes[1].imshow(np.asarray(measures["first"], float).T, vmin=0, vmax=1, cmap="magma", aspect="auto")
    axes[1].set_xlabel("layer")
    axes[1].set_ylabel("head")
    axes[1].set_xticks(layers, [str(layer_number(l)) for l in layers])
    axes[1].set_title("weight on the first token", fontsize=9)
    fig.colorbar(image, ax=axes[1])
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_sinks(measures: dict, path: str, title: str = "") -> str:
    """`sinks_figure` written to PATH; returns PATH."""
    return save_figure(sinks_figure(measures, title), path)


def over_training_figure(steps, series: dict, head_dim: int | None = None, title: str = "",
                         length: int | None = None):
    """Diagnostics against the training step (`jaxpos analyze --checkpoints`): Toeplitz R^2 of E_P E_P^T,
    identical-word locality and symmetry, attention logit rank (mean, max; positional rank) with its bounds
    D = `head_dim` and T = `length` (the rank analysis' window length), and the Muppet importance of each term at
    the last layer. `series` maps names (`over_training.headline`) to one value per step (None where a
    diagnostic did not apply); a panel whose values are all None is left out."""
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
            if name == "numerical rank":
                draw_rank_bounds(ax, head_dim, length)
        ax.set_xlabel("training step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=6)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_over_training(steps, series: dict, path: str, head_dim: int | None = None, title: str = "",
                       length: int | None = None) -> str:
    """`over_training_figure` written to PATH; returns PATH."""
    return save_figure(over_training_figure(steps, series, head_dim, title, length), path)


def curves_figure(runs: dict, metric: str = "loss"):
    """Training and held-out `metric` of several runs against the step, one line per run in each of two panels.
    `runs`: {name: {tag: {step: value}}} as jaxpos.training.metrics.read_scalars returns them."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
    for ax, split, title in zip(axes[0], ("train", "eval"), ("training", "held-out")):
        for name, scalars in runs.items():
            points = sorted(scalars.get(f"{split}/{metric}", {}).items())
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="o" if len(points) < 4 else None, label=name)
        ax.set(title=f"{title} {metric}", xlabel="step", ylabel=metric)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, f"no {split}/{metric} logged", ha="center", va="center", transform=ax.transAxes)
    return fig


def plot_curves(runs: dict, path: str, metric: str = "loss") -> str:
    """Writes `curves_figure` to `path`."""
    return save_figure(curves_figure(runs, metric), path)


def line_style(index: int) -> dict:
    """The `index`-th line's colour (of ten) and dash pattern (of four): no two alike for 40 lines."""
    return dict(color=plt.get_cmap("tab10").colors[index % 10], ls=("-", "--", ":", "-.")[index // 10 % 4])


def lengths_figure(results: dict, metric: str = "loss"):
    """Held-out `metric` against the evaluation length, a line per run (distinct colour and line style), the
    training lengths dotted; lengths a run could not run at are absent from its line and named in the legend. Beside
    it, the metric by position within the row at each run's longest length (`by_position` buckets, at the bucket's
    middle column). `results`: {name: jaxpos.evaluation.lengths.evaluate_lengths's dict}."""
    fig, (ax, by_column) = plt.subplots(1, 2, figsize=(12, 4.2))
    for k, (name, result) in enumerate(results.items()):
        done = [e for e in result["lengths"] if "skipped" not in e]
        skipped = [e["length"] for e in result["lengths"] if "skipped" in e]
        shown = result.get("positions", name)  # the mechanism and RoPE's length rule, where the name lacks them
        label = name + (f", {shown}" if shown != name else "") + (
            f" (cannot run at {', '.join(map(str, skipped))})" if skipped else "")
        ax.plot([e["length"] for e in done], [e[metric] for e in done], marker="o", label=label, **line_style(k))
        if done and done[-1].get("by_position"):
            buckets = [b for b in done[-1]["by_position"] if b[metric] is not None]
            by_column.plot([(b["start"] + b["end"] - 1) / 2 for b in buckets], [b[metric] for b in buckets],
                           marker=".", label=f"{name} at {done[-1]['length']}", **line_style(k))
    for length in sorted({r["train_length"] for r in results.values()}):
        ax.axvline(length, color="0.5", linestyle=":", linewidth=1)
        by_column.axvline(length, color="0.5", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set(title=f"held-out masked-LM {metric} against length (dotted: training length)", xlabel="tokens a row",
           ylabel=metric)
    by_column.set(title=f"{metric} by position within the row, at the longest length", xlabel="column",
                  ylabel=metric)
    for axis in (ax, by_column):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    return fig


def plot_lengths(results: dict, path: str, metric: str = "loss") -> str:
    """Writes `lengths_figure` to `path`."""
    return save_figure(lengths_figure(results, metric), path)
