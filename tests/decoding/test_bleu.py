"""Corpus BLEU through SacreBLEU's defaults."""

import pytest

from jaxpos.decoding import corpus_bleu

REFS = ["The cat sat on the mat.", "There is a dog in the garden, and it barks."]


def test_perfect_and_empty_hypotheses():
    perfect = corpus_bleu(REFS, REFS)
    assert perfect.score == pytest.approx(100.0)
    assert "tok:13a" in perfect.signature and "nrefs:1" in perfect.signature and "case:mixed" in perfect.signature
    assert corpus_bleu(["", ""], REFS).score == 0.0


def test_known_partial_score_and_reference_streams():
    # 13a tokens "The cat sat on a mat ." vs "... the mat .": n-gram precisions 6/7, 4/6, 2/5, 1/4; equal lengths
    result = corpus_bleu(["The cat sat on a mat."], ["The cat sat on the mat."])
    assert result.score == pytest.approx(100 * (6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25, rel=1e-9)
    two = corpus_bleu(["The cat sat on a mat."], [["The cat sat on the mat."], ["The cat sat on a mat."]])
    assert two.score == pytest.approx(100.0) and "nrefs:2" in two.signature
    assert corpus_bleu(["天气很好"], ["天气很好"], tokenize="zh").signature.count("tok:zh") == 1


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 hypotheses but reference stream 0 has 1"):
        corpus_bleu(REFS, REFS[:1])
