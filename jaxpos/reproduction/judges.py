"""The judges of the papers' claims, one a claim: (table, {trained mechanism: the step from which it uses
positions}) -> (the claim's parts, the numbers it measured). What they read: jaxpos.reproduction.readings; how a
part is judged: jaxpos.reproduction.judging."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from jaxpos.reproduction.judging import (CALLED_PARAPHRASE, CORRELATION, EXACT_TOLERANCE, RECOVERABLE,
                                         SHARE_DIFFERENCE, bound, comparison)
from jaxpos.reproduction.matrix import BAG_OF_WORDS, RUN_MECHANISMS
from jaxpos.reproduction.readings import (accuracy, by_seed, describe, field, first_last, label, length_factors,
                                          loss_at, mean_by_seed, parted_at, pooled, rank_correlation,
                                          series_at_first, series_at_step, value_at)
from jaxpos.reproduction.stats import counts


# --- TISA --------------------------------------------------------------------------------------------------------

def tisa_toeplitz(table, trained):
    start = parted_at(trained, "absolute")
    change = by_seed(table, "absolute", first_last("toeplitz_r2", start))
    parts = [comparison("Toeplitz R² of P (absolute), last − first analysed checkpoint at which it uses positions",
                        change, None, 1, ["absolute"])]
    return parts, dict(from_step=start,
                       first=describe(by_seed(table, "absolute", series_at_first("toeplitz_r2", start))),
                       initialisation=describe(by_seed(table, "absolute", series_at_step("toeplitz_r2", 0))),
                       last=describe(by_seed(table, "absolute", field("over_training.series.toeplitz_r2.-1"))),
                       change=describe(change))


def tisa_local(table, trained):
    def excess(r):
        pa = r.get("positional_attention")
        return None if not pa or "skipped" in pa else pa["locality"] - pa["uniform_locality"]
    # locality and symmetry of attention rows (distributions) lie in [0, 1]
    parts = [comparison("locality of TISA's position-only attention softmax_j f(j − i) − a uniform matrix's",
                        by_seed(table, "tisa", excess), None, 1, ["tisa"], bounds=SHARE_DIFFERENCE)]
    return parts, dict(locality=describe(by_seed(table, "tisa", field("positional_attention.locality"))),
                       uniform=describe(by_seed(table, "tisa", field("positional_attention.uniform_locality"))))


def tisa_parameters(table, trained):
    params = {m: by_seed(table, m, field("params.positional")) for m in ("tisa", "tisa_input", "absolute")}
    ratios = [t / a for s, t in params["tisa"].items() if counts(a := params["absolute"].get(s)) and a and counts(t)]
    parts = [comparison("word-order task dev accuracy, TISA + input positions − input positions alone",
                        by_seed(table, "tisa_input", accuracy), by_seed(table, "absolute", accuracy), 1,
                        ["tisa_input", "absolute"], task="order", bounds=SHARE_DIFFERENCE),
             bound(ratios, lambda x: x < 1, "TISA's / input positions' positional parameters", "< 1")]
    return parts, dict(accuracy={m: describe(by_seed(table, m, accuracy)) for m in params},
                       positional_parameters={m: describe(v) for m, v in params.items()})


# Mechanisms whose held-out loss is measured at longer lengths: those of the length-generalisation literature,
# learned absolute positions and DIET-Rel's unclipped table (neither can run past the training length: listed as
# such) and bag of words (which has no positions to generalise).
LENGTH_MECHANISMS = ("none", "absolute", "sinusoidal", "rope", "t5", "alibi", "tisa", "diet_rel", "shaw", "kerple",
                     "fire")


def tisa_inductive(table, trained):
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
                                        if counts(v) and counts(base.get(s))}) for f in longer}
    cannot = sorted({m for m in losses for r in table[m] for e in r.get("lengths") or [] if "skipped" in e})
    return parts, dict(loss=losses, change=change, cannot_run=cannot)


# --- DIET --------------------------------------------------------------------------------------------------------

def diet_per_head(table, trained):
    base = by_seed(table, "absolute", accuracy)
    parts = [comparison(f"word-order task dev accuracy, {label(m)} − input positions", by_seed(table, m, accuracy),
                        base, 1, [m, "absolute"], task="order", bounds=SHARE_DIFFERENCE)
             for m in ("diet_rel", "diet_abs")]
    return parts, dict(accuracy={m: describe(by_seed(table, m, accuracy)) for m in ("absolute", "diet_rel",
                                                                                  "diet_abs")})


def diet_rank(table, trained):
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


def diet_sharing(table, trained):
    acc = {m: by_seed(table, m, accuracy) for m in ("diet_abs", "diet_abs_unshared", "diet_rel", "diet_rel_layer")}
    parts = [comparison("word-order task dev accuracy, DIET-Abs shared by layer − unshared", acc["diet_abs"],
                        acc["diet_abs_unshared"], 1, ["diet_abs", "diet_abs_unshared"], task="order",
                        bounds=SHARE_DIFFERENCE),
             comparison("word-order task dev accuracy, DIET-Rel shared by layer − unshared", acc["diet_rel_layer"],
                        acc["diet_rel"], -1, ["diet_rel_layer", "diet_rel"], task="order", bounds=SHARE_DIFFERENCE)]
    return parts, dict(accuracy={m: describe(v) for m, v in acc.items()})


def diet_segments(table, trained):
    a, b = by_seed(table, "diet_abs_segments", accuracy), by_seed(table, "diet_abs", accuracy)
    parts = [comparison("word-order task dev accuracy, DIET-Abs (shared by layer): per-head − input segments", a, b, 1,
                        ["diet_abs_segments", "diet_abs"], task="order", bounds=SHARE_DIFFERENCE)]
    return parts, dict(accuracy=dict(per_head=describe(a), input=describe(b)))


def diet_step_time(table, trained):
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


def chen_rise(table, trained):
    pool = _pool_of(_learned(table), trained)
    starts = {m: parted_at(trained, m) for m in pool}
    parts, measured = [], dict(mechanisms=pool, from_step=starts)
    for name in ("locality", "symmetry"):
        per_mechanism = {m: by_seed(table, m, first_last(name, starts[m])) for m in pool}
        change = mean_by_seed(list(per_mechanism.values()))
        measured[name] = dict(pooled_change=describe(change),
                              per_mechanism={m: describe(v) for m, v in per_mechanism.items()})
        # of attention rows (distributions): in [0, 1]
        parts.append(comparison(f"identical-word {name}, last − first analysed checkpoint, mean over the learned "
                                "mechanisms that use positions", change, None, 1, pool, bounds=SHARE_DIFFERENCE))
    return parts, measured


def chen_correlation(table, trained):
    pool = _pool_of([m for m in table if m != BAG_OF_WORDS], trained)
    seeds = sorted({r["seed"] for m in pool for r in table[m]})
    parts, measured = [], dict(mechanisms=pool)
    for name in ("locality", "symmetry"):
        rho = {}
        for s in seeds:
            pairs = [(value_at(r, f"last.headline.{name}"), accuracy(r)) for m in pool for r in table[m]
                     if r["seed"] == s]
            pairs = [(a, b) for a, b in pairs if counts(a) and counts(b)]  # a diverged run ranks nowhere
            rho[s] = rank_correlation([a for a, _ in pairs], [b for _, b in pairs])
        measured[name] = dict(describe(rho), undefined_seeds=[s for s, v in rho.items() if v is None])
        parts.append(comparison(f"Spearman ρ across mechanisms of final {name} and word-order task accuracy", rho, None,
                                1, pool, bounds=CORRELATION))
    return parts, measured


def chen_swaps(table, trained):
    pool = _pool_of([m for m in ("absolute", "diet_rel", "tisa") if table.get(m)], trained)

    def gap(r):  # accuracy lost to the global swap less accuracy lost to local shuffles
        probe = r.get("probe")
        if not probe:
            return None
        global_drop = probe["original"] - (1.0 - probe["swapped_paraphrase_share"])
        return global_drop - probe["local_drop"]

    share = pooled(table, pool, field("probe.swapped_paraphrase_share"))
    parts = [comparison(f"share of globally swapped paraphrases still called paraphrases − {CALLED_PARAPHRASE}",
                        {s: v - CALLED_PARAPHRASE for s, v in share.items()}, None, 1, pool,
                        bounds=(-CALLED_PARAPHRASE, 1.0 - CALLED_PARAPHRASE)),
             # = mean local accuracy + share - 1, a difference of two values in [0, 1]
             comparison("accuracy drop under the global swap − under local shuffles (mean over x = 2..5)",
                        pooled(table, pool, gap), None, 1, pool, bounds=SHARE_DIFFERENCE)]
    measured = dict(mechanisms=pool, swapped_paraphrase_share=describe(share),
                    paraphrase_share=describe(pooled(table, pool, field("probe.paraphrase_share"))),
                    local_drop=describe(pooled(table, pool, field("probe.local_drop"))),
                    original=describe(pooled(table, pool, field("probe.original"))))
    return parts, measured


# --- Muppet ------------------------------------------------------------------------------------------------------

def muppet_exact(table, trained):
    errors = [value_at(r, "last.decomposition.max_reconstruction_error") for runs in table.values() for r in runs]
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


def muppet_depth(table, trained):
    parts, measured = [], {}
    for term, name, sign in ((0, "i (input)", -1), (1, "h (attention)", 1), (2, "f (feed-forward)", 1)):
        change = by_seed(table, "absolute", _importance_change(term))
        measured[name] = describe(change)
        parts.append(comparison(f"μ of {name}, last layer − layer 1 (absolute)", change, None, sign, ["absolute"]))
    importance = [v for v in by_seed(table, "absolute", field("last.decomposition.importance")).values() if v]
    return parts, dict(change=measured, importance_mean=np.mean(importance, axis=0).tolist() if importance else None)


# --- identifiability ---------------------------------------------------------------------------------------------

def identifiability_effective(table, trained):
    def change(r):
        lengths = value_at(r, "final.effective_attention.lengths")
        corr = value_at(r, "final.effective_attention.correlation")
        if not lengths:
            return None
        below = [c for n, c in zip(lengths, corr) if n <= r["head_dim"] and counts(c)]
        above = [c for n, c in zip(lengths, corr) if n > r["head_dim"] and counts(c)]
        return above[-1] - below[-1] if below and above else None

    diffs = by_seed(table, "absolute", change)
    parts = [comparison("Pearson r(raw, effective) at the longest T > D − at the longest T <= D (absolute)", diffs,
                        None, -1, ["absolute"], bounds=(2 * CORRELATION[0], 2 * CORRELATION[1]))]
    curves = [v for v in by_seed(table, "absolute", field("final.effective_attention.correlation")).values() if v]
    return parts, dict(change=describe(diffs),
                       lengths=next((value_at(r, "final.effective_attention.lengths")
                                     for r in table.get("absolute", [])), None),
                       correlation_mean=np.mean(curves, axis=0).tolist() if curves else None)


def identifiability_tokens(table, trained):
    def rate(index):
        return field(f"final.identifiability.rates.linear.{index}")

    first = by_seed(table, "absolute", rate(1))
    last = by_seed(table, "absolute", rate(-1))
    parts = [comparison(f"linear-probe identifiability at layer 1 − {RECOVERABLE} (most tokens identified)",
                        {s: None if v is None else v - RECOVERABLE for s, v in first.items()}, None, 1, ["absolute"],
                        bounds=(-RECOVERABLE, 1.0 - RECOVERABLE)),
             comparison("identifiability at the last layer − layer 1", last, first, -1, ["absolute"],
                        bounds=SHARE_DIFFERENCE)]
    rates = [v for v in by_seed(table, "absolute", field("final.identifiability.rates.linear")).values() if v]
    return parts, dict(layer1=describe(first), last=describe(last),
                       rates_mean=np.mean(rates, axis=0).tolist() if rates else None)
