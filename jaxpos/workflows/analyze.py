"""`jaxpos analyze`: the papers' diagnostics of a trained jaxpos run or a Hugging Face BERT/ALBERT folder, at its
newest checkpoint or at every saved one."""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from jaxpos.analysis.loading import load_hf, load_run
from jaxpos.analysis.over_training import analyze_over_training, select_steps
from jaxpos.analysis.report import analyze, corpus_sentences
from jaxpos.data.corpus import embedded_documents, is_eval_document, split_blocks
from jaxpos.progress import status
from jaxpos.run import Run

QUICK = dict(num_probe_words=12, probe_length=32, max_sentences=60, lengths=(8, 16, 32), windows=2,
             probe_epochs=15, probe_patience=5, probe_learning_rate=3e-3, decomposition_sentences=8,
             attribution_windows=1, attribution_length=16)
MAX_SENTENCES = 400


def analysis_texts(path: str | None) -> list[str]:
    """Documents to draw sentences from: a text file's blank-line blocks, or the embedded corpus with the
    documents a run holds out (never trained on) first."""
    if path:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--text {path!r} does not exist")
        with open(path, encoding="utf-8", errors="replace") as f:
            return [b for b in split_blocks(f.read()) if b]
    documents = embedded_documents()
    held_out = [d for i, d in enumerate(documents) if is_eval_document(i, 0.05)]
    return held_out + [d for i, d in enumerate(documents) if not is_eval_document(i, 0.05)]


@dataclasses.dataclass
class Analysis:
    out: str  # the folder written
    report: dict  # report.json's contents, or over_training.json's with `steps`
    steps: list[int] | None = None  # the checkpoints analysed one by one (None: the newest only)


def analyze_model(workdir: str | None = None, hf: str | None = None, out: str | None = None, *,
                  text: str | None = None, quick: bool = False, max_sentences: int | None = None,
                  probe_words: int | None = None, probe_length: int | None = None,
                  lengths: Sequence[int] | None = None, only: Sequence[str] | None = None,
                  checkpoints: str | None = None) -> Analysis:
    """Analyses a `jaxpos train` masked-LM WORKDIR or a Hugging Face folder HF into OUT (default: WORKDIR/analysis,
    or ./analysis_<name> for HF). `quick`: the small budgets of QUICK, which the given numbers override;
    `only`: a subset of the diagnostics; `checkpoints` ('all' or comma-separated steps, WORKDIR only): each of
    those checkpoints into OUT/step_<N>/ and the diagnostics against the step."""
    if checkpoints and not workdir:
        raise ValueError("--checkpoints needs --workdir (a Hugging Face folder has one set of weights)")
    model = load_run(workdir) if workdir else load_hf(hf)
    out = out or (os.path.join(workdir, "analysis") if workdir else f"analysis_{model.name}")
    settings = dict(QUICK) if quick else {}
    for key, value in (("num_probe_words", probe_words), ("probe_length", probe_length),
                       ("max_sentences", max_sentences)):
        if value is not None:
            settings[key] = value
    if lengths is not None:
        settings["lengths"] = tuple(lengths)
    max_sentences = settings.pop("max_sentences", MAX_SENTENCES)
    sentences = []
    if model.tokenize is not None:
        sentences = corpus_sentences(model, analysis_texts(text), max_sentences)
    else:
        status(f"{model.source} has no tokenizer (tokenizer.json, vocab.txt or spiece.model): the sentence-level "
               "diagnostics will be skipped")
    status(f"jaxpos analyze: {model.name} ({model.cfg.position.kind}, L={model.cfg.num_layers}, "
           f"H={model.cfg.num_heads}, d={model.cfg.d_model}), {len(sentences)} sentences -> {out}")
    if checkpoints:
        steps = select_steps(checkpoints, Run.open(workdir, "mlm").steps())
        result = analyze_over_training(model, out, sentences=sentences, steps=steps, only=only, **settings)
        return Analysis(out, result, steps)
    return Analysis(out, analyze(model, out, sentences=sentences, only=only, **settings))
