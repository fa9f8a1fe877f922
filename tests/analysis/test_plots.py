"""Figure content, read from the matplotlib objects: one layer numbering in every figure (layer 1 is the first
layer, the embedding output is "embeddings"), the head colour key of the rank figure, the rank bounds D and T,
and the zoomed, step-titled TISA scores."""

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import QuadMesh

from jaxpos.analysis import plots


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def drawn_axes(fig) -> list:
    """The figure's panels: neither switched off nor a colorbar."""
    return [ax for ax in fig.axes if ax.axison and ax.get_label() != "<colorbar>"]


def tick_texts(ax) -> list[str]:
    return [label.get_text() for label in ax.get_xticklabels()]


def legend_texts(ax) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def tisa_kernels(layers: int, heads: int, kernels: int = 3, seed: int = 0) -> dict:
    """Random TISA parameters a, b, c [layers, heads, kernels], narrow enough to matter within ±30."""
    rng = np.random.default_rng(seed)
    return dict(a=rng.normal(size=(layers, heads, kernels)), b=0.05 + 0.05 * rng.random((layers, heads, kernels)),
                c=rng.normal(size=(layers, heads, kernels)) * 5)


def test_one_layer_numbering():
    assert [plots.layer_label(i) for i in range(3)] == ["layer 1", "layer 2", "layer 3"]
    assert [plots.hidden_state_label(i) for i in range(3)] == ["embeddings", "1", "2"]
    assert plots.head_label(0) == "head 1"
    assert plots.LAYER_AXIS_LABEL == "layer (1 = first)"


def test_every_figure_numbers_layers_from_one():
    rng = np.random.default_rng(0)
    layers, heads = 3, 4
    numbers = ["1", "2", "3"]
    tisa = drawn_axes(plots.tisa_scores_figure(tisa_kernels(layers, heads), 8))
    assert [ax.get_title() for ax in tisa] == ["layer 1", "layer 2", "layer 3"]
    assert legend_texts(tisa[0]) == ["head 1", "head 2", "head 3", "head 4"]

    rank = drawn_axes(plots.ranks_figure(rng.integers(1, 8, (layers, heads)), 8, 16))[0]
    assert tick_texts(rank) == numbers and rank.get_xlabel() == "layer (1 = first)"

    for fig in (plots.term_importance_figure(rng.random((layers + 1, 4))),
                plots.identifiability_figure({"naive": rng.random(layers + 1), "linear": rng.random(layers + 1)})):
        ax = drawn_axes(fig)[0]
        assert tick_texts(ax) == ["embeddings"] + numbers and ax.get_xlabel() == "layer (1 = first)"

    effective = drawn_axes(plots.effective_attention_figure(rng.random((4, 4)), rng.random((4, 4)), [4, 8],
                                                            rng.random((2, layers)), 8))
    assert legend_texts(effective[-1])[:layers] == ["layer 1", "layer 2", "layer 3"]

    by_distance, own_share = drawn_axes(plots.attribution_figure(rng.random((layers, 6)), rng.random(layers),
                                                                 rng.random(layers)))
    assert legend_texts(by_distance) == ["layer 1", "layer 2", "layer 3"]
    assert tick_texts(own_share) == numbers and own_share.get_xlabel() == "layer (1 = first)"


@pytest.mark.parametrize("with_positional", [False, True])
def test_rank_figure_keys_twelve_head_colours(with_positional):
    rng = np.random.default_rng(1)
    layers, heads = 2, 12
    positional = rng.integers(1, 16, (layers, heads)) if with_positional else None
    fig = plots.ranks_figure(rng.integers(1, 16, (layers, heads)), 16, 32, positional, "positional bias")
    keys = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(keys) == 1  # one key for both panels: their heads share the colours
    assert keys[0].get_ylabel().startswith("head")
    assert [t.get_text() for t in keys[0].get_yticklabels()] == [str(h) for h in range(1, heads + 1)]
    # Each head's bars have the colour the key gives that head's number.
    bars = drawn_axes(fig)[0].patches  # head by head, one bar per layer
    key = next(c for c in keys[0].collections if isinstance(c, QuadMesh))
    np.testing.assert_allclose([bars[h * layers].get_facecolor() for h in range(heads)],
                               key.to_rgba(np.arange(1, heads + 1)))


def rank_bound_labels(ax) -> list[str]:
    return [line.get_label() for line in ax.get_lines() if "rank" in line.get_label()]


def test_rank_bounds_name_both_d_and_t():
    rng = np.random.default_rng(2)
    apart = drawn_axes(plots.ranks_figure(rng.integers(1, 8, (2, 2)), 8, 32))[0]
    assert rank_bound_labels(apart) == ["head dim D = 8: rank(QKᵀ) ≤ D", "analysis length T = 32: rank ≤ T"]
    assert apart.get_ylim()[0] == 0 and apart.get_ylim()[1] > 32  # both bounds in view, the legend above them
    equal = drawn_axes(plots.ranks_figure(rng.integers(1, 8, (2, 2)), 32, 32))[0]
    assert rank_bound_labels(equal) == ["head dim D = 32 = T: rank(QKᵀ) ≤ D",
                                        "analysis length T = 32 = D: rank ≤ T"]


def test_over_training_rank_panel_draws_both_bounds():
    series = dict(toeplitz_r2=[0.1, 0.5], locality=[0.3, 0.4], symmetry=[0.5, 0.6], logit_rank_mean=[30.5, 31.0],
                  logit_rank_max=[32, 32], positional_rank_mean=[None, None], importance_last=[None, None])
    fig = plots.over_training_figure([2, 4], series, head_dim=32, length=32)
    rank = next(ax for ax in drawn_axes(fig) if ax.get_title() == "numerical rank")
    bounds = {line.get_label(): line.get_ydata()[0] for line in rank.get_lines() if "rank" in line.get_label()}
    assert bounds == {"head dim D = 32 = T: rank(QKᵀ) ≤ D": 32, "analysis length T = 32 = D: rank ≤ T": 32}
    assert all(label in legend_texts(rank) for label in bounds)
    assert rank.get_ylim()[0] == 0  # a mean rank of 31 read against 0 and the bound 32, not as the whole range

    fig = plots.over_training_figure([2, 4], series, head_dim=32, length=64)
    rank = next(ax for ax in drawn_axes(fig) if ax.get_title() == "numerical rank")
    assert rank_bound_labels(rank) == ["head dim D = 32: rank(QKᵀ) ≤ D", "analysis length T = 64: rank ≤ T"]


def test_tisa_scores_zoom_beside_the_full_span_and_the_step_in_the_title(tmp_path):
    layers, heads, max_offset = 2, 3, 128
    fig = plots.tisa_scores_figure(tisa_kernels(layers, heads), max_offset, step=1000)
    panels = drawn_axes(fig)
    assert [ax.get_title() for ax in panels] == ["layer 1", "layer 1, zoom |j − i| ≤ 30",
                                                 "layer 2", "layer 2, zoom |j − i| ≤ 30"]
    full, zoomed = panels[0], panels[1]
    assert full.get_xlim() == (-127, 127) and zoomed.get_xlim() == (-30, 30)
    offsets = zoomed.get_lines()[0].get_xdata()
    assert offsets.min() == -30 and offsets.max() == 30  # only the zoomed offsets: the y range fits them
    np.testing.assert_allclose(zoomed.get_lines()[0].get_ydata(), full.get_lines()[0].get_ydata()[127 - 30:127 + 31])
    assert "at step 1000" in fig._suptitle.get_text().replace("\n", " ")

    # Spans of ±30 or less have no zoom panel; without a step, the title has none.
    short = plots.tisa_scores_figure(tisa_kernels(1, heads), 31)
    assert [ax.get_xlim() for ax in drawn_axes(short)] == [(-30, 30)]
    assert "step" not in short._suptitle.get_text()
    # The saving wrapper keeps its positional form (params, max_offset, path).
    path = plots.plot_tisa_scores(tisa_kernels(1, heads), 64, str(tmp_path / "tisa_scores.png"))
    assert (tmp_path / "tisa_scores.png").stat().st_size > 1000 and path.endswith("tisa_scores.png")


def test_tisa_zoom_of_a_titled_panel_names_its_layer():
    fig = plots.tisa_scores_figure(tisa_kernels(1, 2), 64, titles=["layer 1: fit r² 0.91 0.88"])
    titles = [ax.get_title() for ax in drawn_axes(fig)]
    assert titles == ["layer 1: fit r² 0.91 0.88", "layer 1, zoom |j − i| ≤ 30"]
