"""`jaxpos analyze`: every diagnostic of the papers that applies to a model, in one report.json plus figures.

Diagnostics (docs/conventions.md, "Analyses"), each recorded under its name in the report, or as
{"skipped": reason} when it does not apply to the model:

  position_gram        P = E_P E_P^T of input position tables and its Toeplitz R^2 (TISA App. B)
  positional_profile   F-hat_P of the first layer per head, TISA kernels fitted to its rows (TISA Fig. 3)
  tisa_scores          the learned TISA scoring functions (TISA models)
  identical_word       positional weight matrices from identical-word sentences, locality and symmetry (Chen)
  rank                 numerical rank of the pre-softmax attention logits and of positional attention matrices
                       (DIET Fig. 2, 8)
  decomposition        Muppet term importance across layers and feed-forward linearity r^2
  effective_attention  raw vs effective attention, Pearson r against sequence length, with the rank tolerance
                       and the rank of each head's value-output map T it kept (Brunner section 3)
  identifiability      token identifiability per layer, naive and linear probes (Brunner section 4)
  attribution          hidden token attribution by neighbour distance (Brunner section 5)
  sinks                where attention sinks: the weight on the first token, on [SEP], on the most-attended key
                       and on a learned sink logit, per layer and head, against the uniform floor

report.json holds scalars, per-layer/per-head values and the identical-word matrices (so their scores can be
recomputed); the larger matrices (P, F-hat_P, raw identical-word attention) are in arrays.npz.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.analysis import attribution, effective_attention, locality, plots, rank, sinks, tisa_fit, toeplitz
from jaxpos.analysis.decomposition import TERMS, decompose
from jaxpos.analysis.identifiability import identifiability_by_layer
from jaxpos.analysis.loading import AnalyzedModel
from jaxpos.analysis.probing import identical_word_attention, sample_probe_words
from jaxpos.analysis.profile import positional_profile
from jaxpos.analysis.taps import (attention_logits, has_learned_input_positions, input_position_embedding, run_encoder,
                                  value_output_maps, value_path_problem)
from jaxpos.attention.bias import position_logits
from jaxpos.data.mlm import split_sentences
from jaxpos.models import position_params
from jaxpos.positions import MECHANISMS, make_position
from jaxpos.positions.tisa import TisaOptions, tisa_scores
from jaxpos.progress import Progress, progress

log = logging.getLogger(__name__)

DIAGNOSTICS = ("position_gram", "positional_profile", "tisa_scores", "identical_word", "rank", "decomposition",
               "effective_attention", "identifiability", "attribution", "sinks")


class Skip(Exception):
    """A diagnostic that does not apply to the model; the message says why."""


@dataclasses.dataclass
class Options:
    num_probe_words: int = 100  # identical-word probing (Chen A.1: 100 words)
    probe_length: int = 128  # ... each repeated to this length (Chen: 128)
    lengths: Sequence[int] = (16, 32, 64, 128)  # effective attention at these sequence lengths
    windows: int = 8  # text windows per length (effective attention, logit rank)
    probe_kinds: Sequence[str] = ("naive", "linear")  # token identifiability probes
    probe_epochs: int = 200  # epoch budget of a probe (the paper stops after 20 epochs without gain)
    probe_patience: int = 20
    probe_learning_rate: float = 1e-4  # the paper's Adam rate; raise it with a small epoch budget
    decomposition_sentences: int = 16
    attribution_windows: int = 4
    attribution_length: int = 32
    sink_sentences: int = 64  # sentences whose attention the sink measures average over
    seed: int = 0
    figures: bool = True  # PNG figures beside report.json (off: numbers only, e.g. many runs' analyses)


@dataclasses.dataclass
class _Context:
    model: AnalyzedModel
    out_dir: str
    sentences: list  # of int32 arrays, special tokens included, each at most the model's max length
    options: Options
    arrays: dict  # large matrices for arrays.npz

    @property
    def cfg(self):
        return self.model.cfg

    @property
    def params(self):
        return self.model.params

    def figure(self, name: str) -> str:
        return os.path.join(self.out_dir, name)

    @property
    def plots(self):
        """jaxpos.analysis.plots, or a stand-in whose plot functions draw nothing (options.figures off)."""
        if not self.options.figures:
            return _NO_PLOTS
        return plots


class _NoPlots:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


_NO_PLOTS = _NoPlots()


# float32 matrix products at full precision in every diagnostic: a GPU's default (TF32, about 1e-3 relative) is
# coarser than what they compare, e.g. Muppet's terms against the hidden states (1e-4)
ANALYSIS_PRECISION = "highest"


def analyze(model: AnalyzedModel, out_dir: str, *, sentences: Sequence[Sequence[int]], num_probe_words: int = 100,
            probe_length: int = 128, only: Sequence[str] | None = None, **options) -> dict:
    """Runs every applicable diagnostic on `model`, writes out_dir/report.json, arrays.npz and PNG figures, and
    returns the report. `sentences`: token id sequences as the model sees them (e.g. `model.encode(text)`);
    they feed the sentence-level diagnostics and, concatenated, the fixed-length windows. Further keyword
    options: see `Options`. `only` restricts the run to some of `DIAGNOSTICS`."""
    opts = Options(num_probe_words=num_probe_words, probe_length=probe_length, **options)
    names = list(DIAGNOSTICS if only is None else only)
    unknown = sorted(set(names) - set(DIAGNOSTICS))
    if unknown:
        raise ValueError(f"unknown diagnostics {unknown}; choose from {', '.join(DIAGNOSTICS)}")
    os.makedirs(out_dir, exist_ok=True)
    cfg = model.cfg
    kept = [np.asarray(s, np.int32)[:cfg.max_length] for s in sentences if len(s) >= 3]
    ctx = _Context(model, out_dir, kept, opts, {})
    report = dict(
        model=dict(name=model.name, source=os.path.abspath(model.source), position=cfg.position.kind,
                   num_layers=cfg.num_layers, num_heads=cfg.num_heads, d_model=cfg.d_model, head_dim=cfg.head_dim,
                   max_length=cfg.max_length, vocab_size=cfg.vocab_size, layer_norm=cfg.layer_norm,
                   origin=dict(model.info)),
        sentences=dict(count=len(kept), tokens=int(sum(len(s) for s in kept))),
        options=dataclasses.asdict(opts), skipped={}, seconds={})
    bar = Progress(names, desc="analyze", unit="diagnostic")
    for name in bar:
        bar.set_postfix_str(name)
        start = time.perf_counter()
        try:
            with jax.default_matmul_precision(ANALYSIS_PRECISION):
                report[name] = _DIAGNOSTIC_FUNCTIONS[name](ctx)
        except Skip as why:
            report[name] = {"skipped": str(why)}
            report["skipped"][name] = str(why)
        if not opts.figures and isinstance(report[name], dict):
            report[name].pop("figure", None)
        report["seconds"][name] = round(time.perf_counter() - start, 3)
    bar.close()
    if not kept and len(report["skipped"]) == len(names):  # nothing was read: an error, not a report
        reasons = "; ".join(f"{name}: {why}" for name, why in report["skipped"].items())
        raise ValueError(f"nothing to analyse in {model.source}: every diagnostic asked for was skipped ({reasons})")
    if ctx.arrays:
        np.savez_compressed(os.path.join(out_dir, "arrays.npz"), **ctx.arrays)
    report = jsonable(report)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1, allow_nan=False)
    return report


def jsonable(x):
    """Numpy scalars and arrays as Python numbers and lists; NaN and infinities as None (strict JSON)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer, int)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    return x


# --- inputs ------------------------------------------------------------------------------------------------------

def corpus_sentences(model: AnalyzedModel, texts: Sequence[str], max_sentences: int, min_tokens: int = 6):
    """Token ids (via `model.encode`, special tokens included) of the first `max_sentences` sentences of
    `texts` that have between `min_tokens` and the model's max length tokens; sentences are split as the
    masked-LM pipeline splits them."""
    out = []
    for text in texts:
        for sentence in split_sentences(text):
            ids = model.encode(sentence)
            if min_tokens <= len(ids) <= model.cfg.max_length:
                out.append(np.asarray(ids, np.int32))
                if len(out) >= max_sentences:
                    return out
    return out


def token_windows(model: AnalyzedModel, sentences, length: int, count: int) -> np.ndarray:
    """Up to `count` rows of exactly `length` tokens: consecutive text of the sentences (special tokens
    stripped), framed by [CLS] ... [SEP] where the model has them. -> [count', length] (count' may be 0)."""
    special = {model.cls_id, model.sep_id} - {None}
    stream = np.asarray([t for s in sentences for t in s if t not in special], np.int32)
    frame = (model.cls_id is not None) + (model.sep_id is not None)
    body = length - frame
    rows = []
    for start in range(0, len(stream) - body + 1, body):
        row = stream[start:start + body]
        row = ([model.cls_id] if model.cls_id is not None else []) + list(row) + (
            [model.sep_id] if model.sep_id is not None else [])
        rows.append(row)
        if len(rows) >= count:
            break
    return np.asarray(rows, np.int32).reshape(len(rows), length)


SENTENCE_BATCH = 16  # sentences per forward pass; every batch is padded to one shape, so one compilation


def _sentence_batches(sentences, batch: int = SENTENCE_BATCH, length: int | None = None):
    """(ids [batch, T], piece ids [batch, T] with 1 = token and 0 = padding, number of real rows) per batch,
    T the longest sentence (or `length`); a short last batch is filled with rows of padding only."""
    length = length or max(len(s) for s in sentences)
    for start in range(0, len(sentences), batch):
        chunk = list(sentences[start:start + batch])
        ids = np.zeros((batch, length), np.int32)
        piece_ids = np.zeros_like(ids)
        for row, s in enumerate(chunk):
            ids[row, :len(s)], piece_ids[row, :len(s)] = s, 1
        yield ids, piece_ids, len(chunk)


def _run(ctx: _Context, ids, piece_ids=None):
    """(weights [L, B, H, T, T], hidden states [L+1, B, T, d]) as numpy."""
    weights, states = run_encoder(ctx.cfg, ctx.params, ids, piece_ids)
    return np.asarray(weights), np.asarray(states)


def _usable_lengths(ctx: _Context, lengths) -> list[int]:
    return sorted({min(int(n), ctx.cfg.max_length) for n in lengths if int(n) >= 3})


def _input_position_table(ctx: _Context) -> np.ndarray | None:
    """[n, E] the positions added to the token embeddings (learned or sinusoidal), or None."""
    table = input_position_embedding(ctx.cfg, ctx.params["encoder"], ctx.cfg.max_length)
    return None if table is None else np.asarray(table, np.float64)


# --- diagnostics -------------------------------------------------------------------------------------------------

def _position_gram(ctx: _Context) -> dict:
    table = _input_position_table(ctx)
    if table is None:
        raise Skip(f"position.kind={ctx.cfg.position.kind!r} adds no position embeddings at the input")
    gram = toeplitz.position_gram(table)
    r2 = toeplitz.toeplitz_r2(gram)
    ctx.arrays["position_gram"] = gram

    ctx.plots.plot_position_gram(gram, r2, ctx.figure("position_gram.png"), ctx.model.name)
    return dict(toeplitz_r2=r2, n=gram.shape[0], learned=has_learned_input_positions(ctx.cfg),
                figure="position_gram.png", array="arrays.npz:position_gram")


def _positional_profile(ctx: _Context) -> dict:
    cfg = ctx.cfg
    if not has_learned_input_positions(cfg):
        raise Skip(f"F-hat_P needs learned input position embeddings; position.kind={cfg.position.kind!r}"
                   + (" without tisa.input_positions" if cfg.position.kind == "tisa" else "") + " has none")

    profile = positional_profile(cfg, ctx.params)  # [H, n, n]
    n = profile.shape[-1]
    scores = np.asarray(tisa_fit.profile_rows_to_offsets(profile))  # [H, 2n-1] over offsets -(n-1)..n-1
    offsets = np.arange(-(n - 1), n)
    kernels = (cfg.position.options if cfg.position.kind == "tisa" else TisaOptions()).num_kernels  # TISA's S
    fit = tisa_fit.fit_tisa_kernels(scores, offsets, num_kernels=kernels)
    kernels = {k: np.asarray(fit[k])[None] for k in "abc"}  # one "layer": the first
    ctx.plots.plot_tisa_scores(kernels, n, ctx.figure("positional_profile.png"), profiles=scores[None],
                               titles=[f"{plots.layer_label(0)}: fit r² {' '.join(f'{r:.2f}' for r in fit['r2'])}"],
                               suptitle=f"{ctx.model.name}: F̂_P rows by offset (dashed), fitted TISA kernels")
    ctx.arrays["positional_profile"] = profile
    return dict(layer=0, toeplitz_r2=toeplitz.toeplitz_r2(profile), fit_r2=fit["r2"],
                kernels={k: np.asarray(fit[k]) for k in "abc"}, offset_scores=scores,
                figure="positional_profile.png", array="arrays.npz:positional_profile")


def _tisa_scores(ctx: _Context) -> dict:
    cfg = ctx.cfg
    if cfg.position.kind != "tisa":
        raise Skip(f"position.kind={cfg.position.kind!r} is not TISA")

    kernels = {k: np.asarray(position_params(ctx.params)[k]) for k in "abc"}  # [L', H', S]
    span = min(ctx.options.probe_length, cfg.max_length)
    ctx.plots.plot_tisa_scores(kernels, span, ctx.figure("tisa_scores.png"))
    offsets = np.arange(-(span - 1), span)
    scores = np.asarray(tisa_scores(offsets, kernels["a"], kernels["b"], kernels["c"]))  # [L', H', K]
    return dict(kernels=kernels, offsets=[int(offsets[0]), int(offsets[-1])],
                peak_offset=offsets[scores.argmax(-1)], score_at_zero=scores[..., span - 1],
                figure="tisa_scores.png")


def _identical_word(ctx: _Context) -> dict:
    if ctx.model.vocabulary is None:
        raise Skip(f"{ctx.model.source} has no vocabulary file to draw whole words from")

    opts, cfg = ctx.options, ctx.cfg
    length = min(opts.probe_length, cfg.max_length)
    if length < 3:
        raise Skip(f"symmetry needs sequences of 3 or more tokens; probe length is {length}")
    words = sample_probe_words(ctx.model.vocabulary, opts.num_probe_words, seed=opts.seed)
    weights = identical_word_attention(cfg, ctx.params, words, length=length)  # [L, H, n, n]
    per_layer = weights.mean(axis=1)  # [L, n, n]
    overall = per_layer.mean(axis=0)
    scores = lambda m: (locality.locality(m), locality.symmetry(m))  # noqa: E731
    layer_scores = np.asarray([scores(m) for m in per_layer])
    head_scores = np.asarray([[scores(m) for m in layer] for layer in weights])  # [L, H, 2]
    overall_scores = scores(overall)
    ctx.arrays["identical_word_attention"] = weights
    titles = [f"{plots.layer_label(l)}: Loc {a:.3f}, Sym {b:.3f}" for l, (a, b) in enumerate(layer_scores)]
    titles.append(f"all layers: Loc {overall_scores[0]:.3f}, Sym {overall_scores[1]:.3f}")
    ctx.plots.plot_positional_matrices(np.concatenate([per_layer, overall[None]]), titles,
                                       ctx.figure("identical_word.png"),
                                       f"{ctx.model.name}: identical-word attention ({len(words)} words, n = {length})")
    return dict(length=length, num_words=len(words), words=[ctx.model.vocabulary[w] for w in words],
                locality=overall_scores[0], symmetry=overall_scores[1],
                layer_locality=layer_scores[:, 0], layer_symmetry=layer_scores[:, 1],
                head_locality=head_scores[..., 0], head_symmetry=head_scores[..., 1],
                matrix=overall, layer_matrices=per_layer, figure="identical_word.png",
                array="arrays.npz:identical_word_attention")


def no_position_only_logits(cfg) -> str:
    """Why the diagnostics of position-only logits skip a model whose `bias_logits` are None, in one line."""
    why = MECHANISMS[cfg.position.kind].no_position_only_term  # a positional term that involves content, if any
    return f"position.kind={cfg.position.kind!r} has no position-only logits" + (f": {why}" if why else "")


def bias_logits(cfg, params, length: int) -> np.ndarray | None:
    """Position-only attention logits of a logit-bias mechanism (TISA, DIET, T5, ALiBi, TUPE, attenuated) for
    every layer and head, computed from its parameters: [L, H, T, T]; None for mechanisms without one
    (input positions only, RoPE's rotation, Shaw's query-dependent term)."""
    mechanism = MECHANISMS[cfg.position.kind]
    if mechanism.input_only or mechanism.no_position_only_term:
        return None
    positions = jnp.arange(length, dtype=jnp.int32)
    module = make_position(cfg, cfg.num_layers, cfg.causal)
    bias = module.apply({"params": params["encoder"].get("position", {})}, positions, positions)
    out = []
    for layer in range(cfg.num_layers):
        term = position_logits(bias.for_layer(layer), positions, positions) if cfg.plan[layer].positions else \
            np.zeros((1, length, length))  # a NoPE layer of the plan
        if term is None:
            return None
        out.append(np.broadcast_to(np.asarray(term, np.float64), (cfg.num_heads, length, length)))
    return np.stack(out)


def _input_positional_logits(ctx: _Context, length: int) -> np.ndarray | None:
    """[1, H, T, T]: (P W_Q)(P W_K)^T / sqrt(D) of the first layer for input position tables, else None."""
    table = _input_position_table(ctx)
    if table is None:
        return None
    cfg, enc = ctx.cfg, ctx.params["encoder"]
    table = table[:length]
    if cfg.embedding_dim:
        table = table @ np.asarray(enc["embed_projection"]["kernel"], np.float64)
    attention = (enc["layer_shared"] if cfg.share_layers else enc["layer_0"])["self_attention"]
    q = np.einsum("nd,dhk->hnk", table, np.asarray(attention["query"]["kernel"], np.float64))
    k = np.einsum("nd,dhk->hnk", table, np.asarray(attention["key"]["kernel"], np.float64))
    return (np.einsum("hik,hjk->hij", q, k) / np.sqrt(cfg.head_dim))[None]


def _rank(ctx: _Context) -> dict:
    cfg, opts = ctx.cfg, ctx.options
    length = max(_usable_lengths(ctx, opts.lengths) or [min(64, cfg.max_length)])
    rows = token_windows(ctx.model, ctx.sentences, length, opts.windows)
    if len(rows) == 0:
        raise Skip(f"the sentences give no window of {length} tokens")
    # The true pre-softmax logits: log-weights lose each row's constant, and centring them by row subtracts a
    # rank-one term, so their rank can fall one short. Windows go one at a time (no padding, nothing masked).
    logits = np.concatenate([np.asarray(attention_logits(cfg, ctx.params, row[None]), np.float64) for row in rows],
                            axis=1)  # [L, B, H, T, T]
    rtol = rank.default_rtol(logits.shape)  # the logits were computed in float32: float32's eps, not float64's
    logit_rank = rank.numerical_rank(logits, rtol)  # [L, B, H]
    result = dict(length=length, windows=len(rows), head_dim=cfg.head_dim, rtol=rtol,
                  logit_rank=logit_rank.mean(axis=1), logit_rank_mean=float(logit_rank.mean()),
                  logit_rank_max=int(logit_rank.max()))
    first_layer = plots.layer_label(0)
    terms = {"input": (_input_positional_logits(ctx, length), f"input positions (P W_Q)(P W_K)^T, {first_layer}"),
             "bias": (bias_logits(cfg, ctx.params, length), "positional bias")}
    plotted = None
    for key, (matrices, label) in terms.items():
        if matrices is None:
            continue
        ranks = rank.numerical_rank(matrices, rtol)  # [L', H], T x T as the logits
        result[f"positional_{key}"] = dict(form=label, rank=ranks, toeplitz_r2=toeplitz.toeplitz_r2(matrices))
        plotted = (np.asarray(ranks, float), label)
    if plotted is None:
        result["positional"] = {"skipped": no_position_only_logits(cfg)}
    ctx.plots.plot_ranks(result["logit_rank"], cfg.head_dim, length, ctx.figure("rank.png"),
                         *(plotted if plotted else (None, "")))
    result["figure"] = "rank.png"
    return result


def _decomposition(ctx: _Context) -> dict:
    cfg = ctx.cfg
    if cfg.layer_norm != "post":
        raise Skip("the additive decomposition is defined for post-LN encoders; this one is pre-LN")
    problem = value_path_problem(cfg)
    if problem is not None:
        raise Skip(problem)
    if not ctx.sentences:
        raise Skip("no sentences")

    ids, piece_ids, real = next(_sentence_batches(  # padded as the identifiability batches are: one compilation
        ctx.sentences[:ctx.options.decomposition_sentences], max(SENTENCE_BATCH, ctx.options.decomposition_sentences),
        max(len(s) for s in ctx.sentences)))
    parts = decompose(cfg, ctx.params, ids, piece_ids=piece_ids)  # padding rows are masked out
    importance = parts.importance()  # [L+1, 4]
    mask = parts.mask
    error = np.abs(parts.terms.sum(axis=1) - parts.hidden)[:, mask].max()
    ctx.plots.plot_term_importance(importance, ctx.figure("decomposition.png"), TERMS,
                                   f"{ctx.model.name}: importance of e = i + h + f + c")
    return dict(terms=list(TERMS), importance=importance, feedforward_r2=parts.feedforward_linear_r2(),
                max_reconstruction_error=error, sentences=real, tokens=int(mask.sum()),
                figure="decomposition.png")


def _effective_attention(ctx: _Context) -> dict:
    cfg, opts = ctx.cfg, ctx.options
    problem = value_path_problem(cfg)
    if problem is not None:
        raise Skip(problem)
    per_length, ranks, example, lengths, tolerances = [], [], None, [], []
    lengths_to_run = _usable_lengths(ctx, opts.lengths)
    for length in progress(lengths_to_run, desc="effective attention", unit="length", leave=False):
        rows = token_windows(ctx.model, ctx.sentences, length, opts.windows)
        if len(rows) == 0:
            continue
        correlations, window_ranks = [], []
        for row in rows:  # one window at a time: the value maps are [L, 1, H, T, d]
            weights, states = _run(ctx, row[None])
            maps = value_output_maps(cfg, ctx.params, states)
            rtol = rank.default_rtol(maps.shape)  # computed in float32: float32's eps at this T
            effective = effective_attention.effective_attention(weights, maps, rtol)
            correlations.append(effective_attention.attention_correlation(weights, effective)[:, 0])  # [L, H]
            window_ranks.append(rank.numerical_rank(maps, rtol)[:, 0])  # the rank the projection kept
            example = (weights[-1, 0, 0], effective[-1, 0, 0], length, window_ranks[-1][-1, 0])
        lengths.append(length)
        tolerances.append(rtol)
        per_length.append(np.stack(correlations))  # [W, L, H]
        ranks.append(np.stack(window_ranks))  # [W, L, H]
    if not lengths:
        raise Skip("the sentences give no window of any of the requested lengths")
    by_layer = np.stack([np.nanmean(c, axis=(0, 2)) for c in per_length])  # [len, L]
    raw, effective, length, example_rank = example
    ctx.plots.plot_effective_attention(raw, effective, lengths, by_layer, cfg.head_dim,
                                       ctx.figure("effective_attention.png"),
                                       f"{plots.layer_label(cfg.num_layers - 1)}, {plots.head_label(0)}, T = {length}, "
                                       f"rank {example_rank} of {length}")
    found = ", ".join(f"T={n}: rank {r.min()}" + (f"-{r.max()}" if r.max() > r.min() else "") + f" of {n}"
                      + f" (tolerance {tol:.3g})" for n, r, tol in zip(lengths, ranks, tolerances))
    return dict(lengths=lengths, windows=[len(c) for c in per_length], head_dim=cfg.head_dim,
                rtol=tolerances, value_map_rank=[r.mean(axis=0) for r in ranks],  # [L, H] per length
                rank_summary=f"rank tolerance max(T, d) x float32 eps x the largest singular value of T; {found}",
                correlation=[float(np.nanmean(c)) for c in per_length], correlation_by_layer=by_layer,
                correlation_by_head=[np.nanmean(c, axis=0) for c in per_length], figure="effective_attention.png")


def _identifiability(ctx: _Context) -> dict:
    if len(ctx.sentences) < 7:
        raise Skip(f"a 70/15/15 split by sentence needs at least 7 sentences; have {len(ctx.sentences)}")

    opts = ctx.options
    hidden, sentence_ids = [], []
    batches = _sentence_batches(ctx.sentences)
    for index, (ids, piece_ids, real) in enumerate(progress(batches, desc="encode sentences", unit="batch", leave=False,
                                                       total=math.ceil(len(ctx.sentences) / SENTENCE_BATCH))):
        _, states = _run(ctx, ids, piece_ids)  # [L+1, B, T, d]
        tokens = piece_ids[:real].astype(bool)
        hidden.append(states[:, :real][:, tokens])
        sentence_ids.append(np.repeat(index * SENTENCE_BATCH + np.arange(real), tokens.sum(axis=1)))
    hidden = np.concatenate(hidden, axis=1)  # [L+1, N, d]
    sentence_ids = np.concatenate(sentence_ids)
    inputs = hidden[0]  # x_i: what the first layer receives (token + position + type embeddings, normalised)
    rates = {}
    for kind in progress(opts.probe_kinds, desc="probes", unit="probe", leave=False):
        extra = {} if kind == "naive" else dict(learning_rate=opts.probe_learning_rate,
                                                patience=opts.probe_patience, max_epochs=opts.probe_epochs)
        rates[kind] = identifiability_by_layer(hidden, inputs, sentence_ids, kind=kind, seed=opts.seed, **extra)
    ctx.plots.plot_identifiability(rates, ctx.figure("identifiability.png"),
                                   f"{ctx.model.name}: token identifiability")
    return dict(rates=rates, tokens=len(sentence_ids), sentences=len(ctx.sentences),
                probe=dict(epochs=opts.probe_epochs, patience=opts.probe_patience,
                           learning_rate=opts.probe_learning_rate),
                inputs="hidden state 0 (the embedding layer's output)", figure="identifiability.png")


def _attribution(ctx: _Context) -> dict:
    cfg, opts = ctx.cfg, ctx.options
    length = min(opts.attribution_length, cfg.max_length)
    rows = token_windows(ctx.model, ctx.sentences, length, opts.attribution_windows)
    if len(rows) == 0:
        raise Skip(f"the sentences give no window of {length} tokens")
    table = np.asarray(ctx.params["token_embed"]["embedding"])
    layers = list(range(1, cfg.num_layers + 1))  # hidden states after each layer (0 would be the embeddings)
    summaries = []
    for row in progress(rows, desc="attribution", unit="window", leave=False):
        contributions = attribution.token_contributions(cfg, ctx.params, table[row], layers=layers)  # [L, T, T]
        summaries.append({k: np.asarray(v, np.float64) for k, v in
                          attribution.attribution_summary(contributions).items()})
    mean = {k: np.mean([s[k] for s in summaries], axis=0) for k in summaries[0]}
    own, top = mean["own_share"], mean["top_contributor"]
    ctx.plots.plot_attribution(mean["by_distance"], own, top, ctx.figure("attribution.png"))
    return dict(length=length, windows=len(rows), layers=layers, self_share=own, top_share=top,
                by_distance=mean["by_distance"], figure="attribution.png")


def measure_sinks(model: AnalyzedModel, sentences) -> dict:
    """Where `model`'s attention sinks over `sentences` (token ids, special tokens included): {"sentences",
    "tokens", each measure of `jaxpos.analysis.sinks` [L, H], "mean": their means over layers and heads}."""
    sentences = [np.asarray(s, np.int32)[:model.cfg.max_length] for s in sentences]
    batches = []
    for ids, piece_ids, real in _sentence_batches(sentences):
        weights, _ = run_encoder(model.cfg, model.params, ids, piece_ids)  # [L, B, H, T, T]
        valid = piece_ids[:real].astype(bool)
        batches.append((sinks.attention_sinks(np.asarray(weights)[:, :real], valid, ids[:real], model.sep_id),
                        int(valid.sum())))
    measures = sinks.combine_sinks(batches)
    return dict(sentences=len(sentences), tokens=int(sum(count for _, count in batches)), **measures,
                mean=sinks.sinks_summary(measures))


def _sinks(ctx: _Context) -> dict:
    sentences = ctx.sentences[:ctx.options.sink_sentences]
    if not sentences:
        raise Skip("no sentences")
    found = measure_sinks(ctx.model, sentences)
    ctx.plots.plot_sinks(found, ctx.figure("sinks.png"), f"{ctx.model.name}: where attention sinks")
    return dict(found, figure="sinks.png")


_DIAGNOSTIC_FUNCTIONS = dict(
    position_gram=_position_gram, positional_profile=_positional_profile, tisa_scores=_tisa_scores,
    identical_word=_identical_word, rank=_rank, decomposition=_decomposition,
    effective_attention=_effective_attention, identifiability=_identifiability, attribution=_attribution,
    sinks=_sinks)
assert tuple(_DIAGNOSTIC_FUNCTIONS) == DIAGNOSTICS
