"""Corpus BLEU as the papers report it: SacreBLEU with its default settings (13a tokenizer, mixed case,
exponential smoothing) on detokenized text, with the signature that makes a score reproducible."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from sacrebleu.metrics import BLEU


@dataclasses.dataclass(frozen=True)
class BleuResult:
    score: float  # corpus BLEU, 0..100
    signature: str  # e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    details: str  # SacreBLEU's line: n-gram precisions, brevity penalty, lengths

    def __str__(self) -> str:
        return f"{self.details} {self.signature}"


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]],
                tokenize: str | None = None) -> BleuResult:
    """BLEU of detokenized `hypotheses` [N] against one reference per sentence ([N] strings) or several
    reference streams ([R][N]). `tokenize`: SacreBLEU's tokenizer, None = its default ("13a"; "zh", "ja-mecab"
    for those targets). Raises ValueError when a reference stream and the hypotheses differ in length."""
    hypotheses = list(hypotheses)
    streams = [list(references)] if not references or isinstance(references[0], str) else \
        [list(stream) for stream in references]
    for i, stream in enumerate(streams):
        if len(stream) != len(hypotheses):
            raise ValueError(f"{len(hypotheses)} hypotheses but reference stream {i} has {len(stream)} sentences")
    metric = BLEU(tokenize=tokenize)
    result = metric.corpus_score(hypotheses, streams)
    return BleuResult(score=float(result.score), signature=str(metric.get_signature()), details=str(result))
