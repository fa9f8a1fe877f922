"""The papers' claims: what each says, the paper's own figure, the runs it reads, and its judge (the judges:
jaxpos/reproduction/judges.py; how they are judged: judging.py; their verdicts: verdicts.py)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

from jaxpos.reproduction.judges import (LENGTH_MECHANISMS, chen_correlation, chen_rise, chen_swaps, diet_per_head,
                                        diet_rank, diet_segments, diet_sharing, diet_step_time,
                                        identifiability_effective, identifiability_tokens, muppet_depth, muppet_exact,
                                        tisa_inductive, tisa_local, tisa_parameters, tisa_toeplitz)
from jaxpos.reproduction.matrix import BAG_OF_WORDS, RUN_MECHANISMS, STAGES

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
    # the mechanisms without which a timed claim compares nothing (its mechanisms are timed only when all are run)
    timing_needs: tuple[str, ...] = ()

    def timed(self, mechanisms: Sequence[str]) -> list[str]:
        """The mechanisms of `mechanisms` this claim has timed alone: none unless it reads step times and the
        plan runs every one of `timing_needs` beside at least one other of its mechanisms."""
        chosen = list(self.runs_needed(mechanisms)) if self.timed_alone else []
        needed = all(m in chosen for m in self.timing_needs) and len(chosen) > len(self.timing_needs)
        return chosen if needed else []

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


CLAIMS = (
    Claim("tisa_toeplitz", "TISA", "Fig. 1–2",
          "The Gram matrix P = E_P E_Pᵀ of learned absolute position embeddings becomes more Toeplitz "
          "(translation-invariant) during training.", ("absolute",), ("over_training",), tisa_toeplitz,
          "The paper compares two trained models (ALBERT v1 and v2); here the change runs from the first analysed "
          "checkpoint at which learned absolute positions are used (the learning curve stays below bag of words "
          "from there) to the last. An embedding not yet used is near random, and P = E_P E_Pᵀ of one is close to "
          "a scaled identity, trivially Toeplitz; the initialisation (step 0) is reported beside as a reference."),
    Claim("tisa_local", "TISA", "Fig. 3",
          "TISA's learned positional scoring functions are local: attention from position alone concentrates on "
          "nearby offsets.", ("tisa",), (), tisa_local),
    Claim("tisa_parameters", "TISA", "Tables 2–3",
          "Adding TISA's few positional parameters to a model with input position embeddings improves it "
          "downstream.", ("tisa", "tisa_input", "absolute"), ("order",), tisa_parameters,
          "The paper adds TISA to a pretrained ALBERT and fine-tunes; here both models are pretrained from scratch."),
    Claim("tisa_inductive", "TISA", "§1, Table 1",
          "TISA is inductive: run past the length it was trained at, it uses the longer context, so its held-out "
          "masked-LM loss falls rather than rises.",
          LENGTH_MECHANISMS, ("lengths",), tisa_inductive,
          "Each mechanism is scored at 1×, 2× and 4× its training length on the same held-out text, in rows that "
          "are one contiguous span each (`jaxpos evaluate --lengths`); the verdict reads TISA's change paired by "
          "seed (it holds where the loss falls, as more context helps a model that generalises, and is "
          "contradicted where it rises; an unchanged loss is inconclusive, as a t test cannot show equality). Every "
          "other mechanism's change is in the numbers and the figure; learned absolute positions and DIET-Rel's "
          "unclipped table cannot run past the training length."),
    Claim("diet_per_head", "DIET", "Table 2",
          "Per-head positional attention (DIET-Rel, DIET-Abs) beats absolute position embeddings added at the "
          "input on downstream tasks.", ("absolute", "diet_rel", "diet_abs"), ("order",), diet_per_head),
    Claim("diet_rank", "DIET", "Fig. 2, Theorem 1",
          "With position embeddings added at the input, each head's attention logit matrix has rank at most the "
          "head dimension D; per-head positional attention exceeds it.",
          ("absolute", "sinusoidal", "diet_rel", "diet_abs"), ("last",), diet_rank,
          "Ranks are numerical ranks of held-out windows at the last checkpoint (largest over layers, heads and "
          "windows).", gated=False),
    Claim("diet_sharing", "DIET", "Table 9",
          "Sharing the positional attention across layers improves DIET-Abs and hurts DIET-Rel.",
          ("diet_abs", "diet_abs_unshared", "diet_rel", "diet_rel_layer"), ("order",), diet_sharing),
    Claim("diet_segments", "DIET", "Table 8",
          "Moving segment information from input embeddings to per-head segment attention improves DIET on a "
          "sentence-pair task.", ("diet_abs_segments", "diet_abs"), ("order",), diet_segments,
          "Pretraining has no sentence pairs: the segment tables are learned in fine-tuning on the word-order "
          "pairs."),
    Claim("diet_step_time", "DIET", "§3.3",
          "Per-head positional attention adds little to the training step; Shaw et al.'s relative position vectors "
          "cost more.", ("shaw", "diet_rel", "diet_abs"), (), diet_step_time,
          "Step times come from a timing pass after the matrix, each mechanism alone on the device (one seed's "
          "recipe on random rows, compiled first, then a window of steps per seed of the plan, the mechanisms "
          "taking their windows in turn; window k paired with seed k), not from the runs, which shared the device. "
          "They rank costs at this size only.", gated=False, timed_alone=True, timing_needs=("shaw",)),
    Claim("chen_rise", "Chen et al.", "Fig. 2",
          "The locality and symmetry of learned positional encodings rise during pretraining.", "learned",
          ("over_training",), chen_rise,
          "Each mechanism's change runs from its first analysed checkpoint at which it uses positions (its "
          "learning curve stays below bag of words from there) to the last; the per-seed value is the mean change "
          "over the learned mechanisms that use positions."),
    Claim("chen_correlation", "Chen et al.", "Fig. 3",
          "Models whose positional attention is more local and more symmetric score higher downstream.", "all",
          ("order", "last"), chen_correlation,
          "Across the mechanisms that use positions, per seed; the paper varies handcrafted encodings instead. ρ "
          "is undefined (no value) in a seed where every mechanism has the same accuracy or the same locality."),
    Claim("chen_swaps", "Chen et al.", "Table 3",
          "Models are robust to local word shuffles but fail on global swaps: a swap that changes the meaning "
          "mostly goes unnoticed.", ("absolute", "diet_rel", "tisa"), ("finetune", "probe"), chen_swaps,
          "On the paraphrase task, as the paper runs it on SNLI: local shuffles inside windows of x = 2..5 words of "
          "sentence A keep the label; two content words >= 5 apart swapped in one sentence of a paraphrase pair "
          "make it a non-paraphrase (the paper swaps agent and patient). Pooled over the mechanisms that use "
          "positions."),
    Claim("muppet_exact", "Muppet", "eq. 1–6",
          "Each output vector of a post-LN encoder is exactly the sum of an input term, an attention term, a "
          "feed-forward term and a bias/normalisation term.", ("absolute", "tisa", "diet_rel", "diet_abs"),
          ("last",), muppet_exact, gated=False),
    Claim("muppet_depth", "Muppet", "Fig. 3",
          "Across layers, the importance of the input-embedding term falls while the attention and feed-forward "
          "terms gain.", ("absolute",), ("last",), muppet_depth),
    Claim("identifiability_effective", "Identifiability", "Fig. 1c",
          "Once the sequence is longer than the head dimension, attention weights are not identifiable: effective "
          "attention departs from raw attention.", ("absolute",), ("final",), identifiability_effective),
    Claim("identifiability_tokens", "Identifiability", "Fig. 2a",
          "Token identity can be recovered from hidden states of early layers, and less so with depth.",
          ("absolute",), ("final",), identifiability_tokens),
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
