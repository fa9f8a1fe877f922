"""The papers' claims as functions: the numbers the runs measured -> a verdict.

A verdict is "holds", "contradicted" or "inconclusive" (at this scale), with the reason in words. The rules:
  * a comparison (two groups of runs, a trend between checkpoints, a value against a constant) needs two or more
    seeds; its spread is the sample standard deviation over seeds (per-seed values of a pooled statistic where a
    claim is about several mechanisms). If mean +- std of one side overlaps the other side's (or a difference's
    interval contains 0), the difference is within the seeds' spread: inconclusive, whatever its sign;
  * a bound that every run must satisfy (the decomposition is exact, an input-position model's logit rank is at
    most D) is checked on each run, with any number of seeds: all satisfy -> holds, none -> contradicted;
  * a claim made of several parts holds when every part holds and is contradicted when any part is.
`table` everywhere is {mechanism: [result.json of each seed]} (jaxpos.reproduction.pipeline).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from jaxpos.reproduction.runs import RUN_MECHANISMS

HOLDS, CONTRADICTED, INCONCLUSIVE = "holds", "contradicted", "inconclusive"
VERDICTS = (HOLDS, CONTRADICTED, INCONCLUSIVE)
EXACT_TOLERANCE = 1e-4  # max |sum of the Muppet terms - hidden state| in float32 analyses
RECOVERABLE = 0.5  # "token identity is recoverable": the linear probe identifies most tokens


# --- statistics and verdict rules --------------------------------------------------------------------------------

def stats(values: Sequence[float]) -> dict:
    """{"mean", "std" (sample, ddof=1; None for one value), "n", "values"} of finite values."""
    xs = [float(v) for v in values if v is not None and np.isfinite(v)]
    if not xs:
        return dict(mean=None, std=None, n=0, values=[])
    return dict(mean=float(np.mean(xs)), std=float(np.std(xs, ddof=1)) if len(xs) > 1 else None, n=len(xs),
                values=xs)


def fmt(s: dict, digits: int = 3) -> str:
    """'mean ± std (n=k)' of a stats dict."""
    if not s or s["n"] == 0:
        return "not measured"
    if s["std"] is None:
        return f"{s['mean']:.{digits}g} (n=1)"
    return f"{s['mean']:.{digits}g} ± {s['std']:.{digits}g} (n={s['n']})"


def verdict(value: str, reason: str, kind: str = "comparison") -> dict:
    """{"verdict", "reason", "kind"}: kind 'comparison' (needs seeds), 'bound' (run by run) or 'claim' (parts)."""
    if value not in VERDICTS:
        raise ValueError(f"verdict {value!r}; choose from {VERDICTS}")
    return dict(verdict=value, reason=reason, kind=kind)


def compare(a: Sequence[float], b: Sequence[float], expect: str, what_a: str, what_b: str) -> dict:
    """Verdict on "a is greater (expect='greater') / less (expect='less') than b", per-seed values of each."""
    if expect not in ("greater", "less"):
        raise ValueError(f"expect={expect!r}; choose 'greater' or 'less'")
    sa, sb = stats(a), stats(b)
    if sa["n"] == 0 or sb["n"] == 0:
        return verdict(INCONCLUSIVE, f"not measured: {what_a if sa['n'] == 0 else what_b} has no runs here")
    said = f"{what_a} {fmt(sa)} vs {what_b} {fmt(sb)}"
    if sa["n"] < 2 or sb["n"] < 2:
        return verdict(INCONCLUSIVE, f"{said}: one seed gives no spread to judge a difference by")
    if sa["mean"] - sa["std"] <= sb["mean"] + sb["std"] and sb["mean"] - sb["std"] <= sa["mean"] + sa["std"]:
        return verdict(INCONCLUSIVE, f"{said}: the difference {sa['mean'] - sb['mean']:+.3g} is within the seeds' "
                                     "spread (mean ± std overlap)")
    greater = sa["mean"] > sb["mean"]
    if greater == (expect == "greater"):
        return verdict(HOLDS, f"{said}: {what_a} is {'higher' if greater else 'lower'} beyond the seeds' spread")
    return verdict(CONTRADICTED, f"{said}: {what_a} is {'higher' if greater else 'lower'} beyond the seeds' spread, "
                                 f"against the claim")


def sign(values: Sequence[float], expect: str, what: str) -> dict:
    """Verdict on "the per-seed values are positive (expect='positive') / negative", e.g. differences between
    the last and the first checkpoint, or a value less a constant."""
    if expect not in ("positive", "negative"):
        raise ValueError(f"expect={expect!r}; choose 'positive' or 'negative'")
    s = stats(values)
    if s["n"] == 0:
        return verdict(INCONCLUSIVE, f"not measured: no run gives {what}")
    said = f"{what} {fmt(s)}"
    if s["n"] < 2:
        return verdict(INCONCLUSIVE, f"{said}: one seed gives no spread to judge it by")
    if s["mean"] - s["std"] <= 0 <= s["mean"] + s["std"]:
        return verdict(INCONCLUSIVE, f"{said}: 0 is within the seeds' spread (mean ± std)")
    positive = s["mean"] > 0
    if positive == (expect == "positive"):
        return verdict(HOLDS, f"{said}: {'above' if positive else 'below'} 0 beyond the seeds' spread")
    return verdict(CONTRADICTED, f"{said}: {'above' if positive else 'below'} 0 beyond the seeds' spread, against "
                                 "the claim")


def bound(values: Sequence[float], check: Callable[[float], bool], what: str, rule: str) -> dict:
    """Verdict on "every run satisfies `check`" (`rule` says it in words, e.g. '<= D = 32')."""
    xs = [v for v in values if v is not None]
    if not xs:
        return verdict(INCONCLUSIVE, f"not measured: no run gives {what}", "bound")
    ok = [bool(check(v)) for v in xs]
    shown = ", ".join(f"{v:.3g}" for v in xs[:12]) + (" ..." if len(xs) > 12 else "")
    if all(ok):
        return verdict(HOLDS, f"{what} {rule} in all {len(xs)} runs ({shown})", "bound")
    if not any(ok):
        return verdict(CONTRADICTED, f"{what} is not {rule} in any of the {len(xs)} runs ({shown})", "bound")
    return verdict(INCONCLUSIVE, f"{what} is {rule} in {sum(ok)} of {len(xs)} runs ({shown})", "bound")


def all_of(parts: Sequence[dict]) -> dict:
    """A claim of several parts: contradicted if any part is, holds if all do, else inconclusive."""
    values = [p["verdict"] for p in parts]
    if CONTRADICTED in values:
        return verdict(CONTRADICTED, "a part is contradicted", "claim")
    if values and all(v == HOLDS for v in values):
        return verdict(HOLDS, "every part holds", "claim")
    return verdict(INCONCLUSIVE, "not every part is decided", "claim")


# --- reading the runs --------------------------------------------------------------------------------------------

def _get(result: dict, path: str):
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


def per_seed(table: dict, mechanism: str, value: Callable[[dict], float | None]) -> list[float]:
    """The value of each seed's run of `mechanism` (runs where it is None are left out)."""
    return [v for v in (value(r) for r in table.get(mechanism, [])) if v is not None]


def pooled(table: dict, mechanisms: Sequence[str], value: Callable[[dict], float | None]) -> list[float]:
    """Per seed, the mean of `value` over the runs of `mechanisms` with that seed."""
    by_seed: dict[int, list[float]] = {}
    for m in mechanisms:
        for r in table.get(m, []):
            v = value(r)
            if v is not None:
                by_seed.setdefault(r["seed"], []).append(v)
    return [float(np.mean(by_seed[s])) for s in sorted(by_seed)]


def first_last(series: str, index: int = -1) -> Callable[[dict], float | None]:
    """The change of an over-training series from the first to the last checkpoint."""
    def change(r):
        values = _get(r, f"over_training.series.{series}")
        if not values or values[0] is None or values[index] is None or len(values) < 2:
            return None
        return values[index] - values[0]
    return change


def field(path: str) -> Callable[[dict], float | None]:
    return lambda r: _get(r, path)


def accuracy(r):  # the DIET protocol's per-run score: the maximum dev accuracy over evaluations
    return _get(r, "finetune.best")


def _present(table: dict, names: Sequence[str]) -> list[str]:
    return [m for m in names if table.get(m)]


def _label(m: str) -> str:
    return RUN_MECHANISMS[m].label if m in RUN_MECHANISMS else m


def _claim(id_: str, paper: str, reference: str, claim: str, parts: list[dict], measured: dict,
           caveat: str | None = None) -> dict:
    overall = all_of(parts)
    return dict(id=id_, paper=paper, reference=reference, claim=claim, parts=parts, measured=measured,
                caveat=caveat, verdict=overall["verdict"], reason=overall["reason"])


def _part(what: str, result: dict) -> dict:
    return dict(what=what, **result)


# --- TISA --------------------------------------------------------------------------------------------------------

def tisa_toeplitz(table: dict) -> dict:
    """TISA Fig. 1-2: the learned absolute P = E_P E_P^T grows more Toeplitz during training."""
    diffs = per_seed(table, "absolute", first_last("toeplitz_r2"))
    first = per_seed(table, "absolute", field("over_training.series.toeplitz_r2.0"))
    last = per_seed(table, "absolute", field("over_training.series.toeplitz_r2.-1"))
    part = _part("Toeplitz R² of P (absolute), last − first checkpoint", sign(diffs, "positive", "ΔR²"))
    return _claim("tisa_toeplitz", "TISA", "Fig. 1–2",
                  "The Gram matrix P = E_P E_Pᵀ of learned absolute position embeddings becomes more Toeplitz "
                  "(translation-invariant) during training.", [part],
                  dict(first_checkpoint=stats(first), last_checkpoint=stats(last), change=stats(diffs)),
                  caveat="The first analysed checkpoint is the first one saved (a quarter of the steps), not the "
                         "initialisation.")


def tisa_local(table: dict) -> dict:
    """TISA Fig. 3: the learned TISA scoring functions are mostly local."""
    above = per_seed(table, "tisa", lambda r: None if not r.get("positional_attention") else
                     r["positional_attention"]["locality"] - r["positional_attention"]["uniform_locality"])
    loc = per_seed(table, "tisa", field("positional_attention.locality"))
    uniform = per_seed(table, "tisa", field("positional_attention.uniform_locality"))
    part = _part("locality of TISA's position-only attention softmax_j f(j − i) minus a uniform matrix's",
                 sign(above, "positive", "locality − uniform"))
    return _claim("tisa_local", "TISA", "Fig. 3",
                  "TISA's learned positional scoring functions are local: attention from position alone concentrates "
                  "on nearby offsets.", [part],
                  dict(locality=stats(loc), uniform_locality=stats(uniform), excess=stats(above)))


def tisa_parameters(table: dict) -> dict:
    """TISA Table 2-3: TISA without input positions matches or beats absolute positions with far fewer
    positional parameters."""
    acc_t, acc_a = per_seed(table, "tisa", accuracy), per_seed(table, "absolute", accuracy)
    loss_t = per_seed(table, "tisa", field("pretrain.eval_loss"))
    loss_a = per_seed(table, "absolute", field("pretrain.eval_loss"))
    params_t = per_seed(table, "tisa", field("params.positional"))
    params_a = per_seed(table, "absolute", field("params.positional"))
    parts = [_part("word-order dev accuracy, TISA vs absolute",
                   compare(acc_t, acc_a, "greater", "TISA", "absolute")),
             _part("positional parameters, TISA < absolute",
                   bound([t / a for t, a in zip(params_t, params_a)] if params_a else [], lambda x: x < 1,
                         "TISA's / absolute's positional parameters", "< 1"))]
    return _claim("tisa_parameters", "TISA", "Tables 2–3",
                  "TISA without input position embeddings matches or beats learned absolute positions downstream, "
                  "with a small fraction of the positional parameters.", parts,
                  dict(accuracy=dict(tisa=stats(acc_t), absolute=stats(acc_a)),
                       mlm_eval_loss=dict(tisa=stats(loss_t), absolute=stats(loss_a)),
                       positional_parameters=dict(tisa=stats(params_t), absolute=stats(params_a))),
                  caveat="\"Matches\" cannot be told from \"slightly worse\" within the seeds' spread, so an "
                         "overlap is inconclusive rather than a match.")


# --- DIET --------------------------------------------------------------------------------------------------------

def diet_per_head(table: dict) -> dict:
    """DIET Table 2: per-head positional attention beats absolute positions added at the input."""
    base = per_seed(table, "absolute", accuracy)
    parts, measured = [], dict(absolute=stats(base))
    for m in ("diet_rel", "diet_abs"):
        acc = per_seed(table, m, accuracy)
        measured[m] = stats(acc)
        parts.append(_part(f"word-order dev accuracy, {_label(m)} vs absolute",
                           compare(acc, base, "greater", _label(m), "absolute")))
    return _claim("diet_per_head", "DIET", "Table 2",
                  "Per-head positional attention (DIET-Rel, DIET-Abs) beats absolute position embeddings added at "
                  "the input on downstream tasks.", parts, dict(accuracy=measured))


def diet_rank(table: dict) -> dict:
    """DIET Fig. 2 (Theorem 1): input absolute positions keep every head's attention logits at rank <= D;
    per-head positional biases lift them above D."""
    def excess(r):  # the run's largest logit rank relative to its head dim
        rank = _get(r, "final.rank.logit_rank_max")
        return None if rank is None else rank - r["head_dim"]

    head_dim = next((r["head_dim"] for runs in table.values() for r in runs), None)
    length = next((_get(r, "final.rank.length") for runs in table.values() for r in runs), None)
    ape = [v for m in _present(table, ("absolute", "sinusoidal")) for v in per_seed(table, m, excess)]
    biased = [v for m in _present(table, ("diet_rel", "diet_abs")) for v in per_seed(table, m, excess)]
    parts = [_part("input absolute positions: largest logit rank − D <= 0",
                   bound(ape, lambda x: x <= 0, "largest logit rank − D", "<= 0")),
             _part("DIET-Rel / DIET-Abs: largest logit rank − D > 0",
                   bound(biased, lambda x: x > 0, "largest logit rank − D", "> 0"))]
    measured = {m: stats(per_seed(table, m, field("final.rank.logit_rank_max")))
                for m in _present(table, ("absolute", "sinusoidal", "diet_rel", "diet_abs", "tisa", "t5"))}
    return _claim("diet_rank", "DIET", "Fig. 2, Theorem 1",
                  "With position embeddings added at the input, each head's attention logit matrix has rank at most "
                  "the head dimension D; per-head positional attention exceeds it.", parts,
                  dict(head_dim=head_dim, length=length, logit_rank_max=measured),
                  caveat=f"Ranks are numerical ranks of T = {length} windows of held-out text at the last checkpoint "
                         "(largest over layers, heads and windows).")


def diet_sharing(table: dict) -> dict:
    """DIET Table 9: layer-wise sharing helps DIET-Abs and hurts DIET-Rel."""
    acc = {m: per_seed(table, m, accuracy) for m in ("diet_abs", "diet_abs_unshared", "diet_rel", "diet_rel_layer")}
    parts = [_part("DIET-Abs: shared by layer vs unshared",
                   compare(acc["diet_abs"], acc["diet_abs_unshared"], "greater", "shared", "unshared")),
             _part("DIET-Rel: shared by layer vs unshared",
                   compare(acc["diet_rel_layer"], acc["diet_rel"], "less", "shared", "unshared"))]
    return _claim("diet_sharing", "DIET", "Table 9",
                  "Sharing the positional attention across layers improves DIET-Abs and hurts DIET-Rel.", parts,
                  dict(accuracy={m: stats(v) for m, v in acc.items()}))


def diet_segments(table: dict) -> dict:
    """DIET Table 8: per-head segment attention beats input segment embeddings."""
    a, b = per_seed(table, "diet_abs_segments", accuracy), per_seed(table, "diet_abs", accuracy)
    part = _part("DIET-Abs (shared by layer): per-head vs input segments",
                 compare(a, b, "greater", "per-head segments", "input segments"))
    return _claim("diet_segments", "DIET", "Table 8",
                  "Moving segment information from input embeddings to per-head segment attention improves DIET.",
                  [part], dict(accuracy=dict(per_head=stats(a), input=stats(b))),
                  caveat="The offline word-order task has one sentence per example and pretraining has no sentence "
                         "pairs, so both models see a single segment: differences here are not about segments.")


def diet_step_time(table: dict) -> dict:
    """DIET section 3.3: per-head positional biases cost little step time; Shaw et al.'s relative vectors cost
    more (+13% training on TPU v2 against +0% for DIET)."""
    time_of = {m: per_seed(table, m, field("pretrain.step_time_s")) for m in table}
    parts = [_part(f"step time, Shaw et al. vs {_label(m)}",
                   compare(time_of.get("shaw", []), time_of.get(m, []), "greater", "Shaw", _label(m)))
             for m in ("diet_rel", "diet_abs")]
    return _claim("diet_step_time", "DIET", "§3.3",
                  "Per-head positional attention adds little to the training step; Shaw et al.'s relative position "
                  "vectors cost more.", parts, dict(step_time_s={m: stats(v) for m, v in sorted(time_of.items())}),
                  caveat="Step times were measured on the machine below while other runs shared it, with the XLA "
                         "attention path (the Pallas kernel needs a GPU); they rank costs at this size only.")


# --- Chen et al. ---------------------------------------------------------------------------------------------------

def _learned(table: dict) -> list[str]:
    return [m for m in table if m in RUN_MECHANISMS and RUN_MECHANISMS[m].learned]


def chen_rise(table: dict) -> dict:
    """Chen et al. Fig. 2: locality and symmetry of learned positional encodings rise during training."""
    learned = _learned(table)
    parts, measured = [], {}
    for name in ("locality", "symmetry"):
        change = pooled(table, learned, first_last(name))
        measured[name] = dict(pooled_change=stats(change),
                              per_mechanism={m: stats(per_seed(table, m, first_last(name))) for m in learned})
        parts.append(_part(f"identical-word {name}, last − first checkpoint, mean over learned mechanisms",
                           sign(change, "positive", f"Δ{name}")))
    return _claim("chen_rise", "Chen et al.", "Fig. 2",
                  "The locality and symmetry of learned positional encodings rise during pretraining.", parts,
                  dict(mechanisms=learned, **measured),
                  caveat="Changes run from the first saved checkpoint (a quarter of the steps) to the last; the "
                         "per-seed statistic is the mean change over the learned mechanisms.")


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


def chen_correlation(table: dict) -> dict:
    """Chen et al. Fig. 3: locality and symmetry correlate with downstream scores."""
    seeds = sorted({r["seed"] for runs in table.values() for r in runs})
    parts, measured = [], {}
    for name in ("locality", "symmetry"):
        per_seed_r, constant = [], 0
        for s in seeds:
            pairs = [(_get(r, f"over_training.series.{name}.-1"), accuracy(r)) for runs in table.values()
                     for r in runs if r["seed"] == s]
            pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
            rho = rank_correlation([a for a, _ in pairs], [b for _, b in pairs])
            if rho is not None:
                per_seed_r.append(rho)
            elif len(pairs) >= 3:
                constant += 1
        measured[name] = stats(per_seed_r)
        what = f"Spearman ρ across mechanisms of final {name} and word-order accuracy"
        if not per_seed_r and constant:
            parts.append(_part(what, verdict(INCONCLUSIVE, f"ρ is undefined: in every seed all mechanisms have the "
                                                           f"same word-order accuracy or {name}")))
        else:
            parts.append(_part(what, sign(per_seed_r, "positive", "ρ")))
    return _claim("chen_correlation", "Chen et al.", "Fig. 3",
                  "Models whose positional attention is more local and more symmetric score higher downstream.",
                  parts, dict(mechanisms=len(table), spearman=measured))


def chen_swaps(table: dict) -> dict:
    """Chen et al. Table 3: local swaps barely move accuracy, global swaps do."""
    aware = [m for m in table if m != "none"]
    local = pooled(table, aware, field("probe.local_drop"))
    glob = pooled(table, aware, field("probe.global_drop"))
    parts = [_part("global swap: accuracy drop > 0", sign(glob, "positive", "global-swap drop")),
             _part("local swaps move accuracy less than the global swap",
                   compare(local, glob, "less", "local-swap drop", "global-swap drop"))]
    return _claim("chen_swaps", "Chen et al.", "Table 3",
                  "Models are robust to local word swaps but fail on global swaps (of semantic roles).", parts,
                  dict(mechanisms=aware, local_drop=stats(local), global_drop=stats(glob),
                       per_mechanism={m: dict(local=stats(per_seed(table, m, field("probe.local_drop"))),
                                              global_=stats(per_seed(table, m, field("probe.global_drop"))))
                                      for m in aware}),
                  caveat="A stand-in: no offline task keeps its labels under reordering, so the score is masked-token "
                         "accuracy on the word-order task's test sentences; 'local' shuffles every window of x = 2..5 "
                         "words (stronger than Chen's one constituent), 'global' swaps two content words >= 5 apart "
                         "(not semantic roles). Drops are averaged over the order-aware mechanisms (all but 'none').")


# --- Muppet ------------------------------------------------------------------------------------------------------

def muppet_exact(table: dict) -> dict:
    """Muppet eq. 1-6: the terms i + h + f + c add up to the encoder's output."""
    errors = [v for runs in table.values() for v in (
        _get(r, "final.decomposition.max_reconstruction_error") for r in runs) if v is not None]
    part = _part(f"max |i + h + f + c − e| <= {EXACT_TOLERANCE:g}",
                 bound(errors, lambda x: x <= EXACT_TOLERANCE, "largest reconstruction error",
                       f"<= {EXACT_TOLERANCE:g}"))
    return _claim("muppet_exact", "Muppet", "eq. 1–6",
                  "Each output vector of a post-LN encoder is exactly the sum of an input term, an attention term, "
                  "a feed-forward term and a bias/normalisation term.", [part],
                  dict(max_error=stats(errors)))


def _importance_change(term: int) -> Callable[[dict], float | None]:
    """mu of a term at the last layer minus at the first layer (rows 0 = embeddings, 1..L = layers)."""
    def change(r):
        importance = _get(r, "final.decomposition.importance")
        if not importance or len(importance) < 3:
            return None
        return importance[-1][term] - importance[1][term]
    return change


def muppet_depth(table: dict) -> dict:
    """Muppet Fig. 3: the input term's importance falls with depth, the attention and feed-forward terms'
    rise."""
    parts, measured = [], {}
    for term, name, expect in ((0, "i (input)", "negative"), (1, "h (attention)", "positive"),
                               (2, "f (feed-forward)", "positive")):
        change = per_seed(table, "absolute", _importance_change(term))
        measured[name] = stats(change)
        parts.append(_part(f"μ of {name}, last layer − layer 1 (absolute)", sign(change, expect, f"Δμ {name}")))
    importance = per_seed(table, "absolute", field("final.decomposition.importance"))
    return _claim("muppet_depth", "Muppet", "Fig. 3",
                  "Across layers, the importance of the input-embedding term falls while the attention and "
                  "feed-forward terms gain.", parts,
                  dict(change=measured, importance_mean=np.mean(importance, axis=0).tolist() if importance else None))


# --- identifiability ---------------------------------------------------------------------------------------------

def identifiability_effective(table: dict) -> dict:
    """Brunner et al. Fig. 1c: raw and effective attention stop agreeing once T exceeds the head dimension."""
    def change(r):
        lengths, corr = _get(r, "final.effective_attention.lengths"), _get(r, "final.effective_attention.correlation")
        if not lengths:
            return None
        below = [c for n, c in zip(lengths, corr) if n <= r["head_dim"] and c is not None]
        above = [c for n, c in zip(lengths, corr) if n > r["head_dim"] and c is not None]
        return above[-1] - below[-1] if below and above else None

    diffs = per_seed(table, "absolute", change)
    part = _part("Pearson r(raw, effective) at the longest T > D minus at the longest T <= D (absolute)",
                 sign(diffs, "negative", "Δr"))
    curves = per_seed(table, "absolute", field("final.effective_attention.correlation"))
    return _claim("identifiability_effective", "Identifiability", "Fig. 1c",
                  "Once the sequence is longer than the head dimension, attention weights are not identifiable: "
                  "effective attention departs from raw attention.", [part],
                  dict(change=stats(diffs),
                       lengths=next((_get(r, "final.effective_attention.lengths") for r in table.get("absolute", [])),
                                    None),
                       correlation_mean=np.mean(curves, axis=0).tolist() if curves else None))


def identifiability_tokens(table: dict) -> dict:
    """Brunner et al. Fig. 3: token identity is recoverable from early layers, less so deeper."""
    first = per_seed(table, "absolute", field("final.identifiability.rates.linear.1"))
    fall = per_seed(table, "absolute", lambda r: None if not _get(r, "final.identifiability.rates.linear") else
                    r["final"]["identifiability"]["rates"]["linear"][-1] - r["final"]["identifiability"]["rates"][
                        "linear"][1])
    parts = [_part(f"linear-probe identifiability at layer 1 − {RECOVERABLE} (most tokens identified)",
                   sign([v - RECOVERABLE for v in first], "positive", f"rate − {RECOVERABLE}")),
             _part("identifiability at the last layer − layer 1", sign(fall, "negative", "Δrate"))]
    rates = per_seed(table, "absolute", field("final.identifiability.rates.linear"))
    return _claim("identifiability_tokens", "Identifiability", "Fig. 3",
                  "Token identity can be recovered from hidden states of early layers, and less so with depth.", parts,
                  dict(layer1=stats(first), change=stats(fall),
                       rates_mean=np.mean(rates, axis=0).tolist() if rates else None))


CLAIMS = (tisa_toeplitz, tisa_local, tisa_parameters, diet_per_head, diet_rank, diet_sharing, diet_segments,
          diet_step_time, chen_rise, chen_correlation, chen_swaps, muppet_exact, muppet_depth,
          identifiability_effective, identifiability_tokens)
PAPERS = ("TISA", "DIET", "Chen et al.", "Muppet", "Identifiability")


def evaluate_claims(table: dict) -> list[dict]:
    """Every claim's record (id, paper, reference, claim, parts, measured, verdict, reason, caveat)."""
    return [claim(table) for claim in CLAIMS]
