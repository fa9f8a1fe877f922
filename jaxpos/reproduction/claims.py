"""The papers' claims as functions of the runs' numbers, each with the paper's own figure (their verdicts:
jaxpos/reproduction/verdicts.py).

A claim is made of parts of two kinds:
  * a comparison: per-seed values of two sides paired by seed (runs with the same seed share data order and
    masking; a one-sided quantity such as a change over training is paired with 0), the direction the paper
    claims, and the mechanisms it is about. It is tested only when each of those mechanisms uses positions by the
    end of pretraining (`training_status`: its held-out MLM loss below the bag-of-words model's, paired by seed,
    95% interval excluding 0); otherwise it is "inconclusive: not trained far enough", with the step at which the
    curves part where they do. Every tested comparison of the report gets a paired t test
    (`stats.paired_difference`, two-sided), their p-values are Holm-corrected together (`stats.holm`) and
    `stats.verdict` decides: holds or contradicted when the adjusted p <= alpha, else inconclusive with the
    difference these seeds could have detected;
  * a bound every run must satisfy (the decomposition is exact, input positions keep the logit rank <= D), checked
    run by run with any number of seeds: all satisfy -> holds, none -> contradicted.
A claim holds when every part holds and is contradicted when any part is. `table` everywhere is {mechanism:
[result.json of each seed]} (jaxpos.reproduction.pipeline). PAPER_FIGURES holds each claim's figure from its paper.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Callable, Mapping, Sequence

import numpy as np

from jaxpos.evaluation.metrics import wilson_interval
from jaxpos.reproduction.matrix import BAG_OF_WORDS, RUN_MECHANISMS, STAGES
from jaxpos.reproduction.stats import CONTRADICTED, HOLDS, INCONCLUSIVE

VERDICTS = (HOLDS, CONTRADICTED, INCONCLUSIVE)
ALPHA = 0.05  # family-wise error rate of the report's comparisons (Holm), and the level of the training check
EXACT_TOLERANCE = 1e-4  # max |sum of the Muppet terms - hidden state| in float32 analyses
RECOVERABLE = 0.5  # "token identity is recoverable": the linear probe identifies most tokens
CALLED_PARAPHRASE = 0.5  # "the swap goes unnoticed": most swapped paraphrases are still called paraphrases
NOT_TRAINED = "not trained far enough"  # the reason of a comparison whose mechanisms do not use positions yet
NOT_LEARNED = "did not learn the task"  # the reason of a downstream comparison with a side at chance
STEP_TIMES_FILE = "step_times.json"  # OUT/: the step times of `timed_alone` claims' mechanisms, timed alone


@dataclasses.dataclass(frozen=True)
class PaperFigure:
    """What a paper reports for a claim: where (table or figure) and the value."""

    paper: str
    source: str  # "Table 2", "Fig. 3a", ...
    value: str  # the figure, as the paper gives it


# Every claim's figure in its paper (papers: TISA = Wennberg & Henter; DIET = Chen, Tsai, Bhojanapalli et al.;
# Chen et al. = Locality and Symmetry of Positional Encodings; Muppet = Mickus et al.; Identifiability = Brunner
# et al.). Values are quoted from the text or tables; a figure whose values are only plotted is described.
PAPER_FIGURES = {
    "tisa_toeplitz": PaperFigure("TISA", "Fig. 2 (and Figs. 1, 4-5)",
                                 "the Toeplitz R² of P = E_P E_Pᵀ rises from ALBERT v1 to v2 (longer training) at "
                                 "every model size (arrows; values plotted only)"),
    "tisa_local": PaperFigure("TISA", "Fig. 3 (and Fig. 7)",
                              "the scoring functions of ALBERT base v2's heads peak at offsets within a few tokens "
                              "(the previous or next token, a few to either side; plotted only)"),
    "tisa_inductive": PaperFigure("TISA", "§1, Table 1",
                                  "inductive (handles sequences and dependencies of any length) is the first of the "
                                  "criteria; TISA satisfies it, learned absolute positions (BERT, RoBERTa, ALBERT) "
                                  "\"cannot handle arbitrary-length sequences\" (no lengths are measured)"),
    "tisa_parameters": PaperFigure("TISA", "Tables 2, 3(a)",
                                   "TISA adds 3SHL = 2,160 positional parameters against 393,216 of BERT's input "
                                   "positions; added to ALBERT base v2 (S = 5), GLUE dev +0.4 points on average "
                                   "(e.g. MNLI 83.8 → 84.8)"),
    "diet_per_head": PaperFigure("DIET", "Tables 2, 8",
                                 "GLUE dev average: input positions 84.8; DIET-Rel (per-head positions, input "
                                 "segments) 84.9; DIET-Abs (d_p = 64, input segments) 85.0"),
    "diet_rank": PaperFigure("DIET", "Fig. 2, Theorem 1",
                             "input positions: rank(A) <= d_h = 64 in BERT-base's first layer; DIET-Abs reaches "
                             "d_p + d_h"),
    "diet_sharing": PaperFigure("DIET", "Table 9",
                                "GLUE dev average: DIET-Rel 85.2 unshared → 85.0 shared by layer; DIET-Abs "
                                "(d_p = 64) 85.0 unshared → 85.2 shared by layer"),
    "diet_segments": PaperFigure("DIET", "Table 8",
                                 "GLUE dev average, input → per-head segments: DIET-Rel 84.9 → 85.2; DIET-Abs "
                                 "(d_p = 64) 85.0 → 85.0 (+0.05% in the text)"),
    "diet_step_time": PaperFigure("DIET", "Table 1 (§3.3)",
                                  "training step time against BERT on TPU v2: Shaw et al. +13% (BERT-base), +24% "
                                  "(BERT-small); DIET-Rel and DIET-Abs +0%"),
    "chen_rise": PaperFigure("Chen et al.", "Fig. 2, Table 3",
                             "learned encodings move from their initial values to local, symmetric ones during "
                             "pretraining; after it BERT has locality 0.162 and symmetry 0.879"),
    "chen_correlation": PaperFigure("Chen et al.", "Fig. 3",
                                    "MR accuracy rises steadily with locality (symmetry fixed at 1); with locality "
                                    "in [0.15, 0.3], accuracy rises with symmetry above 0.65 (plotted only)"),
    "chen_swaps": PaperFigure("Chen et al.", "Table 3",
                              "BERT on SNLI: Shuffle-3/4/5 Δ −0.4 / −0.6 / −0.3 points from 89.8; Shuffle-SR Δ −63.9 "
                              "(accuracy 25.9%: three in four swapped pairs still judged entailed)"),
    "muppet_exact": PaperFigure("Muppet", "eq. 1–6",
                                "e = i + h + f + c exactly; the terms sum to the output within ±1e-7 per component"),
    "muppet_depth": PaperFigure("Muppet", "Fig. 3a",
                                "BERT base: the input term i dominates the first layers and falls to μ = 0.045 at "
                                "the last; f at 0.4 or above across most layers; h never above 0.3 on average"),
    "identifiability_effective": PaperFigure("Identifiability", "Fig. 1c",
                                             "Pearson r(raw, effective attention) = 1 below d_v = 64 tokens, then "
                                             "decreasing with the sequence length"),
    "identifiability_tokens": PaperFigure("Identifiability", "Fig. 2a",
                                          "tokens are identifiable in BERT's first layers; from layer 3 the rate "
                                          "falls, and at layer 12 almost 20% are not (MLP probe)"),
}


# --- reading the runs --------------------------------------------------------------------------------------------

def value_at(result: dict, path: str):
    """result['a']['b'][i]... for a dotted path with integer indices; None where anything is missing."""
    node = result
    for key in path.split("."):
        if node is None:
            return None
        if isinstance(node, list):
            index = int(key)
            node = node[index] if -len(node) <= index < len(node) else None
        else:
            node = node.get(key)
    return node


def field(path: str) -> Callable[[dict], float | None]:
    return lambda r: value_at(r, path)


def accuracy(r):  # the downstream score: the word-order pair task's best dev accuracy over evaluations and rates
    return value_at(r, "order.best")


def paraphrase_accuracy(r):  # the lexical paraphrase task's best dev accuracy over evaluations, beside it
    return value_at(r, "finetune.best")


def by_seed(table: dict, mechanism: str, value: Callable[[dict], float | None]) -> dict[int, float | None]:
    """{seed: value of that seed's run of `mechanism`} (None where the run does not give it)."""
    return {r["seed"]: value(r) for r in table.get(mechanism, [])}


def pooled(table: dict, mechanisms: Sequence[str], value: Callable[[dict], float | None]) -> dict[int, float]:
    """Per seed, the mean of `value` over the runs of `mechanisms` with that seed."""
    return mean_by_seed([by_seed(table, m, value) for m in mechanisms])


def mean_by_seed(values: Sequence[Mapping[int, float | None]]) -> dict[int, float]:
    """Per seed, the mean of the given values ({seed: value} each, None left out)."""
    by_seed_values: dict[int, list[float]] = {}
    for one in values:
        for seed, v in one.items():
            if v is not None:
                by_seed_values.setdefault(seed, []).append(v)
    return {seed: float(np.mean(v)) for seed, v in sorted(by_seed_values.items())}


def describe(values) -> dict:
    """{"mean", "sd" (ddof=1; None for one value), "n", "values"} of the finite values of a list or {seed: value}."""
    values = values.values() if isinstance(values, Mapping) else values
    xs = [float(v) for v in values if v is not None and np.isfinite(v)]
    if not xs:
        return dict(mean=None, sd=None, n=0, values=[])
    return dict(mean=float(np.mean(xs)), sd=float(np.std(xs, ddof=1)) if len(xs) > 1 else None, n=len(xs),
                values=xs)


def fmt(s: dict, digits: int = 3) -> str:
    """'mean ± sd (n=k)' of a `describe` dict."""
    if not s or s["n"] == 0:
        return "not measured"
    if s["sd"] is None:
        return f"{s['mean']:.{digits}g} (n=1)"
    return f"{s['mean']:.{digits}g} ± {s['sd']:.{digits}g} (n={s['n']})"


def parted_at(trained: Mapping[str, int], mechanism: str) -> int | None:
    """The step from which `mechanism` uses positions (its curve stays below bag of words), where `trained` (the
    judges' second argument: {mechanism: that step} of the mechanisms that use positions) says; else None."""
    return trained.get(mechanism)


def first_trained(r: dict, start: int | None) -> int | None:
    """The index of a run's first analysed checkpoint at or after step `start` (None: the first one), or None. The
    initialisation (step 0) is a reference, never the start: a change from it measures training, used or not."""
    steps = value_at(r, "over_training.steps") or []
    return next((k for k, step in enumerate(steps) if step > 0 and (start is None or step >= start)), None)


def first_last(series: str, start: int | None = None) -> Callable[[dict], float | None]:
    """The change of an over-training series from the first analysed checkpoint at or after step `start` (the
    step from which the mechanism uses positions; None: the first one after the initialisation) to the last; None
    where fewer than two checkpoints remain."""
    def change(r):
        values = value_at(r, f"over_training.series.{series}")
        first = first_trained(r, start)
        if not values or first is None or first >= len(values) - 1 or values[first] is None or values[-1] is None:
            return None
        return values[-1] - values[first]
    return change


def series_at_step(series: str, step: int) -> Callable[[dict], float | None]:
    """The value of an over-training series at analysed step `step` (0: the initialisation), or None."""
    def value(r):
        steps = value_at(r, "over_training.steps") or []
        return value_at(r, f"over_training.series.{series}.{steps.index(step)}") if step in steps else None
    return value


def series_at_first(series: str, start: int | None = None) -> Callable[[dict], float | None]:
    """The value of an over-training series at the first analysed checkpoint at or after step `start`."""
    def value(r):
        first = first_trained(r, start)
        return None if first is None else value_at(r, f"over_training.series.{series}.{first}")
    return value


def label(m: str) -> str:
    return RUN_MECHANISMS[m].label if m in RUN_MECHANISMS else m


# --- the parts of a claim ------------------------------------------------------------------------------------------

def comparison(what: str, a: Mapping[int, float | None], b: Mapping[int, float | None] | None, expected_sign: int,
               about: Sequence[str], task: str | None = None) -> dict:
    """A comparison part: a - b > 0 (expected_sign = +1) or < 0 (-1), per seed; b = None compares a with 0. It is
    tested only when every mechanism of `about` uses positions ((): always) and, for scores on a downstream `task`
    (a result.json key), learned it in every seed (`learned_task`)."""
    seeds = sorted(set(a) | set(b or {}))
    return dict(kind="comparison", what=what, seeds=seeds, a=[a.get(s) for s in seeds],
                b=[(b or {}).get(s, None) if b is not None else 0.0 for s in seeds], expected_sign=expected_sign,
                about=list(about), task=task)


def learned_task(score: dict) -> bool | None:
    """Whether a run learned a downstream task: the Wilson interval of its best dev accuracy on its `dev_pairs`
    lies above chance, at the level (Šidák) at which the best of its `looks` dev evaluations of a model at chance
    passes 2.5% of the time; None where the result does not give the pair count."""
    if not score.get("dev_pairs") or score.get("best") is None:
        return None
    z = statistics.NormalDist().inv_cdf(0.975 ** (1 / score.get("looks", 1)))
    low, _ = wilson_interval(score["best"] * score["dev_pairs"], score["dev_pairs"], z)
    return low > score["chance"]


def bound(values: Sequence[float | None], check: Callable[[float], bool], what: str, rule: str) -> dict:
    """A bound part, decided here: every run satisfies `check` (`rule` says it in words, e.g. '<= D = 32')."""
    xs = [v for v in values if v is not None]
    part = dict(kind="bound", what=f"{what} {rule}")
    if not xs:
        return dict(part, verdict=INCONCLUSIVE, reason=f"not measured: no run gives {what}")
    ok = [bool(check(v)) for v in xs]
    shown = ", ".join(f"{v:.3g}" for v in xs[:12]) + (" ..." if len(xs) > 12 else "")
    if all(ok):
        return dict(part, verdict=HOLDS, reason=f"{what} {rule} in all {len(xs)} runs ({shown})")
    if not any(ok):
        return dict(part, verdict=CONTRADICTED, reason=f"{what} is not {rule} in any of the {len(xs)} runs ({shown})")
    return dict(part, verdict=INCONCLUSIVE, reason=f"{what} is {rule} in {sum(ok)} of {len(xs)} runs ({shown})")


def all_of(parts: Sequence[dict]) -> tuple[str, str]:
    """A claim of several parts: contradicted if any part is, holds if all do, else inconclusive."""
    values = [p["verdict"] for p in parts]
    if CONTRADICTED in values:
        return CONTRADICTED, "a part is contradicted"
    if values and all(v == HOLDS for v in values):
        return HOLDS, "every part holds"
    if any(p.get("why") == NOT_TRAINED for p in parts):
        return INCONCLUSIVE, f"{NOT_TRAINED} for a part"
    if any(p.get("why") == NOT_LEARNED for p in parts):
        return INCONCLUSIVE, f"a side {NOT_LEARNED} for a part"
    return INCONCLUSIVE, "not every part is decided"


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim of a paper: what it says, the runs it reads (mechanisms, and the stages of `matrix.STAGES` each
    needs) and `judge`, (table, {trained mechanism: the step from which it uses positions}) -> (parts, measured
    numbers)."""

    id: str
    paper: str
    reference: str
    statement: str
    mechanisms: tuple[str, ...] | str  # names, or "all" / "learned" of the profile's mechanisms
    stages: tuple[str, ...]
    judge: Callable[[dict, Mapping[str, int]], tuple[list[dict], dict]]
    caveat: str | None = None
    gated: bool = True  # has a comparison judged only once its mechanisms use positions (read off the curves)
    timed_alone: bool = False  # reads step times of its mechanisms timed alone after the matrix (STEP_TIMES_FILE)

    def runs_needed(self, mechanisms: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """{mechanism: stages} this claim reads of the available `mechanisms`."""
        if self.mechanisms == "all":
            chosen = [m for m in mechanisms if m != BAG_OF_WORDS]
        elif self.mechanisms == "learned":
            chosen = [m for m in mechanisms if RUN_MECHANISMS[m].learned]
        else:
            chosen = [m for m in self.mechanisms if m in mechanisms]
        return {m: self.stages for m in chosen}

    @property
    def figure(self) -> PaperFigure:
        return PAPER_FIGURES[self.id]


# --- TISA --------------------------------------------------------------------------------------------------------

def _tisa_toeplitz(table, trained):
    start = parted_at(trained, "absolute")
    change = by_seed(table, "absolute", first_last("toeplitz_r2", start))
    parts = [comparison("Toeplitz R² of P (absolute), last − first analysed checkpoint at which it uses positions",
                        change, None, 1, ["absolute"])]
    return parts, dict(from_step=start,
                       first=describe(by_seed(table, "absolute", series_at_first("toeplitz_r2", start))),
                       initialisation=describe(by_seed(table, "absolute", series_at_step("toeplitz_r2", 0))),
                       last=describe(by_seed(table, "absolute", field("over_training.series.toeplitz_r2.-1"))),
                       change=describe(change))


def _tisa_local(table, trained):
    def excess(r):
        pa = r.get("positional_attention")
        return None if not pa or "skipped" in pa else pa["locality"] - pa["uniform_locality"]
    parts = [comparison("locality of TISA's position-only attention softmax_j f(j − i) − a uniform matrix's",
                        by_seed(table, "tisa", excess), None, 1, ["tisa"])]
    return parts, dict(locality=describe(by_seed(table, "tisa", field("positional_attention.locality"))),
                       uniform=describe(by_seed(table, "tisa", field("positional_attention.uniform_locality"))))


def _tisa_parameters(table, trained):
    params = {m: by_seed(table, m, field("params.positional")) for m in ("tisa", "tisa_input", "absolute")}
    ratios = [t / a for s, t in params["tisa"].items() if (a := params["absolute"].get(s)) and t is not None]
    parts = [comparison("word-order task dev accuracy, TISA + input positions − input positions alone",
                        by_seed(table, "tisa_input", accuracy), by_seed(table, "absolute", accuracy), 1,
                        ["tisa_input", "absolute"], task="order"),
             bound(ratios, lambda x: x < 1, "TISA's / input positions' positional parameters", "< 1")]
    return parts, dict(accuracy={m: describe(by_seed(table, m, accuracy)) for m in params},
                       positional_parameters={m: describe(v) for m, v in params.items()})


# Mechanisms whose held-out loss is measured at longer lengths: those of the length-generalisation literature,
# learned absolute positions and DIET-Rel's unclipped table (neither can run past the training length: listed as
# such) and bag of words (which has no positions to generalise).
LENGTH_MECHANISMS = ("none", "absolute", "sinusoidal", "rope", "t5", "alibi", "tisa", "diet_rel", "shaw", "kerple",
                     "fire")


def loss_at(factor: int) -> Callable[[dict], float | None]:
    """A run's held-out loss at `factor` times its training length (None where it did not or could not run)."""
    def loss(r):
        entry = next((e for e in r.get("lengths") or [] if e["length"] == factor * r["seq_len"]), None)
        return None if entry is None or "skipped" in entry else entry["loss"]
    return loss


def length_factors(table: dict) -> list[int]:
    """The multiples of the training length the runs were evaluated at."""
    return sorted({e["length"] // r["seq_len"] for runs in table.values() for r in runs
                   for e in r.get("lengths") or []})


def _tisa_inductive(table, trained):
    longer = [f for f in length_factors(table) if f > 1] or [2, 4]  # measured, else the profiles' (not measured)
    parts = [comparison(f"held-out MLM loss at {f}× the training length − at 1×, TISA",
                        by_seed(table, "tisa", loss_at(f)), by_seed(table, "tisa", loss_at(1)), -1, ["tisa"])
             for f in longer]
    losses = {m: {f"{f}x": describe(by_seed(table, m, loss_at(f))) for f in length_factors(table)}
              for m in LENGTH_MECHANISMS if table.get(m)}
    change = {}
    for m in losses:
        base = by_seed(table, m, loss_at(1))
        change[m] = {f"{f}x": describe({s: v - base[s] for s, v in by_seed(table, m, loss_at(f)).items()
                                        if v is not None and base.get(s) is not None}) for f in longer}
    cannot = sorted({m for m in losses for r in table[m] for e in r.get("lengths") or [] if "skipped" in e})
    return parts, dict(loss=losses, change=change, cannot_run=cannot)


# --- DIET --------------------------------------------------------------------------------------------------------

def _diet_per_head(table, trained):
    base = by_seed(table, "absolute", accuracy)
    parts = [comparison(f"word-order task dev accuracy, {label(m)} − input positions", by_seed(table, m, accuracy),
                        base, 1, [m, "absolute"], task="order") for m in ("diet_rel", "diet_abs")]
    return parts, dict(accuracy={m: describe(by_seed(table, m, accuracy)) for m in ("absolute", "diet_rel",
                                                                                  "diet_abs")})


def _diet_rank(table, trained):
    def excess(r):  # the run's largest logit rank relative to its head dim
        rank = value_at(r, "last.rank.logit_rank_max")
        return None if rank is None else rank - r["head_dim"]

    ape = [v for m in ("absolute", "sinusoidal") for v in by_seed(table, m, excess).values()]
    biased = [v for m in ("diet_rel", "diet_abs") for v in by_seed(table, m, excess).values()]
    parts = [bound(ape, lambda x: x <= 0, "input positions: largest logit rank − D", "<= 0"),
             bound(biased, lambda x: x > 0, "DIET-Rel / DIET-Abs: largest logit rank − D", "> 0")]
    head_dim = next((r["head_dim"] for runs in table.values() for r in runs), None)
    length = next((value_at(r, "last.rank.length") for runs in table.values() for r in runs
                   if value_at(r, "last.rank.length")), None)
    return parts, dict(head_dim=head_dim, length=length, logit_rank_max={
        m: describe(by_seed(table, m, field("last.rank.logit_rank_max")))
        for m in ("absolute", "sinusoidal", "diet_rel", "diet_abs") if table.get(m)})


def _diet_sharing(table, trained):
    acc = {m: by_seed(table, m, accuracy) for m in ("diet_abs", "diet_abs_unshared", "diet_rel", "diet_rel_layer")}
    parts = [comparison("word-order task dev accuracy, DIET-Abs shared by layer − unshared", acc["diet_abs"],
                        acc["diet_abs_unshared"], 1, ["diet_abs", "diet_abs_unshared"], task="order"),
             comparison("word-order task dev accuracy, DIET-Rel shared by layer − unshared", acc["diet_rel_layer"],
                        acc["diet_rel"], -1, ["diet_rel_layer", "diet_rel"], task="order")]
    return parts, dict(accuracy={m: describe(v) for m, v in acc.items()})


def _diet_segments(table, trained):
    a, b = by_seed(table, "diet_abs_segments", accuracy), by_seed(table, "diet_abs", accuracy)
    parts = [comparison("word-order task dev accuracy, DIET-Abs (shared by layer): per-head − input segments", a, b, 1,
                        ["diet_abs_segments", "diet_abs"], task="order")]
    return parts, dict(accuracy=dict(per_head=describe(a), input=describe(b)))


def _diet_step_time(table, trained):
    step = {m: by_seed(table, m, field("pretrain.step_time_alone_s")) for m in ("shaw", "diet_rel", "diet_abs")}
    parts = [comparison(f"pretraining step time alone on the device (s), Shaw et al. − {label(m)}", step["shaw"],
                        step[m], 1, []) for m in ("diet_rel", "diet_abs")]
    shared = {m: describe(by_seed(table, m, field("pretrain.step_time_s"))) for m in step}
    return parts, dict(step_time_alone_s={m: describe(v) for m, v in step.items()}, step_time_in_the_runs_s=shared)


# --- Chen et al. ---------------------------------------------------------------------------------------------------

def _learned(table: dict) -> list[str]:
    return [m for m in table if m in RUN_MECHANISMS and RUN_MECHANISMS[m].learned]


def _pool_of(candidates: Sequence[str], trained: Mapping[str, int]) -> list[str]:
    """The candidates that use positions; all of them where none does (the part is then not tested)."""
    return [m for m in candidates if m in trained] or list(candidates)


def _chen_rise(table, trained):
    pool = _pool_of(_learned(table), trained)
    starts = {m: parted_at(trained, m) for m in pool}
    parts, measured = [], dict(mechanisms=pool, from_step=starts)
    for name in ("locality", "symmetry"):
        per_mechanism = {m: by_seed(table, m, first_last(name, starts[m])) for m in pool}
        change = mean_by_seed(list(per_mechanism.values()))
        measured[name] = dict(pooled_change=describe(change),
                              per_mechanism={m: describe(v) for m, v in per_mechanism.items()})
        parts.append(comparison(f"identical-word {name}, last − first analysed checkpoint, mean over the learned "
                                "mechanisms that use positions", change, None, 1, pool))
    return parts, measured


def rank_correlation(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 3 pairs or a constant side."""
    if len(x) < 3:
        return None

    def ranks(v):
        v = np.asarray(v, float)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for value in np.unique(v):  # ties share their mean rank
            r[v == value] = r[v == value].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def _chen_correlation(table, trained):
    pool = _pool_of([m for m in table if m != BAG_OF_WORDS], trained)
    seeds = sorted({r["seed"] for m in pool for r in table[m]})
    parts, measured = [], dict(mechanisms=pool)
    for name in ("locality", "symmetry"):
        rho = {}
        for s in seeds:
            pairs = [(value_at(r, f"last.headline.{name}"), accuracy(r)) for m in pool for r in table[m]
                     if r["seed"] == s]
            pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
            rho[s] = rank_correlation([a for a, _ in pairs], [b for _, b in pairs])
        measured[name] = dict(describe(rho), undefined_seeds=[s for s, v in rho.items() if v is None])
        parts.append(comparison(f"Spearman ρ across mechanisms of final {name} and word-order task accuracy", rho, None,
                                1, pool))
    return parts, measured


def _chen_swaps(table, trained):
    pool = _pool_of([m for m in ("absolute", "diet_rel", "tisa") if table.get(m)], trained)

    def gap(r):  # accuracy lost to the global swap less accuracy lost to local shuffles
        probe = r.get("probe")
        if not probe:
            return None
        global_drop = probe["original"] - (1.0 - probe["swapped_paraphrase_share"])
        return global_drop - probe["local_drop"]

    share = pooled(table, pool, field("probe.swapped_paraphrase_share"))
    parts = [comparison(f"share of globally swapped paraphrases still called paraphrases − {CALLED_PARAPHRASE}",
                        {s: v - CALLED_PARAPHRASE for s, v in share.items()}, None, 1, pool),
             comparison("accuracy drop under the global swap − under local shuffles (mean over x = 2..5)",
                        pooled(table, pool, gap), None, 1, pool)]
    measured = dict(mechanisms=pool, swapped_paraphrase_share=describe(share),
                    paraphrase_share=describe(pooled(table, pool, field("probe.paraphrase_share"))),
                    local_drop=describe(pooled(table, pool, field("probe.local_drop"))),
                    original=describe(pooled(table, pool, field("probe.original"))))
    return parts, measured


# --- Muppet ------------------------------------------------------------------------------------------------------

def _muppet_exact(table, trained):
    errors = [v for runs in table.values() for v in (value_at(r, "last.decomposition.max_reconstruction_error")
                                                      for r in runs) if v is not None]
    parts = [bound(errors, lambda x: x <= EXACT_TOLERANCE, "largest |i + h + f + c − e|", f"<= {EXACT_TOLERANCE:g}")]
    return parts, dict(max_error=describe(errors))


def _importance_change(term: int) -> Callable[[dict], float | None]:
    """mu of a term at the last layer minus at the first layer (rows 0 = embeddings, 1..L = layers)."""
    def change(r):
        importance = value_at(r, "last.decomposition.importance")
        if not importance or len(importance) < 3:
            return None
        return importance[-1][term] - importance[1][term]
    return change


def _muppet_depth(table, trained):
    parts, measured = [], {}
    for term, name, sign in ((0, "i (input)", -1), (1, "h (attention)", 1), (2, "f (feed-forward)", 1)):
        change = by_seed(table, "absolute", _importance_change(term))
        measured[name] = describe(change)
        parts.append(comparison(f"μ of {name}, last layer − layer 1 (absolute)", change, None, sign, ["absolute"]))
    importance = [v for v in by_seed(table, "absolute", field("last.decomposition.importance")).values() if v]
    return parts, dict(change=measured, importance_mean=np.mean(importance, axis=0).tolist() if importance else None)


# --- identifiability ---------------------------------------------------------------------------------------------

def _identifiability_effective(table, trained):
    def change(r):
        lengths = value_at(r, "final.effective_attention.lengths")
        corr = value_at(r, "final.effective_attention.correlation")
        if not lengths:
            return None
        below = [c for n, c in zip(lengths, corr) if n <= r["head_dim"] and c is not None]
        above = [c for n, c in zip(lengths, corr) if n > r["head_dim"] and c is not None]
        return above[-1] - below[-1] if below and above else None

    diffs = by_seed(table, "absolute", change)
    parts = [comparison("Pearson r(raw, effective) at the longest T > D − at the longest T <= D (absolute)", diffs,
                        None, -1, ["absolute"])]
    curves = [v for v in by_seed(table, "absolute", field("final.effective_attention.correlation")).values() if v]
    return parts, dict(change=describe(diffs),
                       lengths=next((value_at(r, "final.effective_attention.lengths")
                                     for r in table.get("absolute", [])), None),
                       correlation_mean=np.mean(curves, axis=0).tolist() if curves else None)


def _identifiability_tokens(table, trained):
    def rate(index):
        return field(f"final.identifiability.rates.linear.{index}")

    first = by_seed(table, "absolute", rate(1))
    last = by_seed(table, "absolute", rate(-1))
    parts = [comparison(f"linear-probe identifiability at layer 1 − {RECOVERABLE} (most tokens identified)",
                        {s: None if v is None else v - RECOVERABLE for s, v in first.items()}, None, 1, ["absolute"]),
             comparison("identifiability at the last layer − layer 1", last, first, -1, ["absolute"])]
    rates = [v for v in by_seed(table, "absolute", field("final.identifiability.rates.linear")).values() if v]
    return parts, dict(layer1=describe(first), last=describe(last),
                       rates_mean=np.mean(rates, axis=0).tolist() if rates else None)


CLAIMS = (
    Claim("tisa_toeplitz", "TISA", "Fig. 1–2",
          "The Gram matrix P = E_P E_Pᵀ of learned absolute position embeddings becomes more Toeplitz "
          "(translation-invariant) during training.", ("absolute",), ("over_training",), _tisa_toeplitz,
          "The paper compares two trained models (ALBERT v1 and v2); here the change runs from the first analysed "
          "checkpoint at which learned absolute positions are used (the learning curve stays below bag of words "
          "from there) to the last. An embedding not yet used is near random, and P = E_P E_Pᵀ of one is close to "
          "a scaled identity, trivially Toeplitz; the initialisation (step 0) is reported beside as a reference."),
    Claim("tisa_local", "TISA", "Fig. 3",
          "TISA's learned positional scoring functions are local: attention from position alone concentrates on "
          "nearby offsets.", ("tisa",), (), _tisa_local),
    Claim("tisa_parameters", "TISA", "Tables 2–3",
          "Adding TISA's few positional parameters to a model with input position embeddings improves it "
          "downstream.", ("tisa", "tisa_input", "absolute"), ("order",), _tisa_parameters,
          "The paper adds TISA to a pretrained ALBERT and fine-tunes; here both models are pretrained from scratch."),
    Claim("tisa_inductive", "TISA", "§1, Table 1",
          "TISA is inductive: run past the length it was trained at, it uses the longer context, so its held-out "
          "masked-LM loss falls rather than rises.",
          LENGTH_MECHANISMS, ("lengths",), _tisa_inductive,
          "Each mechanism is scored at 1×, 2× and 4× its training length on the same held-out text, in rows that "
          "are one contiguous span each (`jaxpos evaluate --lengths`); the verdict reads TISA's change paired by "
          "seed (it holds where the loss falls, as more context helps a model that generalises, and is "
          "contradicted where it rises; an unchanged loss is inconclusive, as a t test cannot show equality). Every "
          "other mechanism's change is in the numbers and the figure; learned absolute positions and DIET-Rel's "
          "unclipped table cannot run past the training length."),
    Claim("diet_per_head", "DIET", "Table 2",
          "Per-head positional attention (DIET-Rel, DIET-Abs) beats absolute position embeddings added at the "
          "input on downstream tasks.", ("absolute", "diet_rel", "diet_abs"), ("order",), _diet_per_head),
    Claim("diet_rank", "DIET", "Fig. 2, Theorem 1",
          "With position embeddings added at the input, each head's attention logit matrix has rank at most the "
          "head dimension D; per-head positional attention exceeds it.",
          ("absolute", "sinusoidal", "diet_rel", "diet_abs"), ("last",), _diet_rank,
          "Ranks are numerical ranks of held-out windows at the last checkpoint (largest over layers, heads and "
          "windows).", gated=False),
    Claim("diet_sharing", "DIET", "Table 9",
          "Sharing the positional attention across layers improves DIET-Abs and hurts DIET-Rel.",
          ("diet_abs", "diet_abs_unshared", "diet_rel", "diet_rel_layer"), ("order",), _diet_sharing),
    Claim("diet_segments", "DIET", "Table 8",
          "Moving segment information from input embeddings to per-head segment attention improves DIET on a "
          "sentence-pair task.", ("diet_abs_segments", "diet_abs"), ("order",), _diet_segments,
          "Pretraining has no sentence pairs: the segment tables are learned in fine-tuning on the word-order "
          "pairs."),
    Claim("diet_step_time", "DIET", "§3.3",
          "Per-head positional attention adds little to the training step; Shaw et al.'s relative position vectors "
          "cost more.", ("shaw", "diet_rel", "diet_abs"), (), _diet_step_time,
          "Step times come from a timing pass after the matrix, each mechanism alone on the device (one seed's "
          "recipe on random rows, compiled first, then a window of steps per seed of the plan, the mechanisms "
          "taking their windows in turn; window k paired with seed k), not from the runs, which shared the device. "
          "They rank costs at this size only.", gated=False, timed_alone=True),
    Claim("chen_rise", "Chen et al.", "Fig. 2",
          "The locality and symmetry of learned positional encodings rise during pretraining.", "learned",
          ("over_training",), _chen_rise,
          "Each mechanism's change runs from its first analysed checkpoint at which it uses positions (its "
          "learning curve stays below bag of words from there) to the last; the per-seed value is the mean change "
          "over the learned mechanisms that use positions."),
    Claim("chen_correlation", "Chen et al.", "Fig. 3",
          "Models whose positional attention is more local and more symmetric score higher downstream.", "all",
          ("order", "last"), _chen_correlation,
          "Across the mechanisms that use positions, per seed; the paper varies handcrafted encodings instead. ρ "
          "is undefined (no value) in a seed where every mechanism has the same accuracy or the same locality."),
    Claim("chen_swaps", "Chen et al.", "Table 3",
          "Models are robust to local word shuffles but fail on global swaps: a swap that changes the meaning "
          "mostly goes unnoticed.", ("absolute", "diet_rel", "tisa"), ("finetune", "probe"), _chen_swaps,
          "On the paraphrase task, as the paper runs it on SNLI: local shuffles inside windows of x = 2..5 words of "
          "sentence A keep the label; two content words >= 5 apart swapped in one sentence of a paraphrase pair "
          "make it a non-paraphrase (the paper swaps agent and patient). Pooled over the mechanisms that use "
          "positions."),
    Claim("muppet_exact", "Muppet", "eq. 1–6",
          "Each output vector of a post-LN encoder is exactly the sum of an input term, an attention term, a "
          "feed-forward term and a bias/normalisation term.", ("absolute", "tisa", "diet_rel", "diet_abs"),
          ("last",), _muppet_exact, gated=False),
    Claim("muppet_depth", "Muppet", "Fig. 3",
          "Across layers, the importance of the input-embedding term falls while the attention and feed-forward "
          "terms gain.", ("absolute",), ("last",), _muppet_depth),
    Claim("identifiability_effective", "Identifiability", "Fig. 1c",
          "Once the sequence is longer than the head dimension, attention weights are not identifiable: effective "
          "attention departs from raw attention.", ("absolute",), ("final",), _identifiability_effective),
    Claim("identifiability_tokens", "Identifiability", "Fig. 2a",
          "Token identity can be recovered from hidden states of early layers, and less so with depth.",
          ("absolute",), ("final",), _identifiability_tokens),
)
CLAIMS_BY_ID = {c.id: c for c in CLAIMS}
PAPERS = ("TISA", "DIET", "Chen et al.", "Muppet", "Identifiability")
STAGE_IMPLIES = {"probe": ("finetune",), "over_training": ("last",)}  # a stage and what it needs done first


def select_claims(ids: Sequence[str] | None = None) -> list[Claim]:
    """The claims of `ids` (all when None), in the report's order; ValueError for an unknown id."""
    if ids is None:
        return list(CLAIMS)
    unknown = [i for i in ids if i not in CLAIMS_BY_ID]
    if unknown or not ids:
        raise ValueError(f"unknown claims {unknown}; choose from {', '.join(CLAIMS_BY_ID)}")
    return [c for c in CLAIMS if c.id in ids]


def runs_needed(claims: Sequence[Claim], mechanisms: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """{mechanism: stages} that `claims` read of `mechanisms`, plus the bag-of-words runs (pretraining only) that
    the learning curves are judged against where a claim's comparisons wait for them."""
    needs: dict[str, set] = {}
    for claim in claims:
        chosen = claim.runs_needed(mechanisms)
        for m, stages in chosen.items():
            needs.setdefault(m, set()).update(stages)
        if chosen and claim.gated:
            needs.setdefault(BAG_OF_WORDS, set())
    downstream = {s for stages in needs.values() for s in stages} & {"finetune", "order"}
    if downstream:  # bag of words fine-tuned on every task: the floor a model without positions reaches
        needs.setdefault(BAG_OF_WORDS, set()).update(downstream)
    for stages in needs.values():
        for stage, implied in STAGE_IMPLIES.items():
            if stage in stages:
                stages.update(implied)
    return {m: tuple(s for s in STAGES if s in needs[m]) for m in RUN_MECHANISMS if m in needs}
