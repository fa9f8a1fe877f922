"""SentencePiece: documented special ids, caching in the workdir, loading a .model file."""

import os
import time

import pytest

from jaxpos.data import (MLM_SPECIAL_TOKENS, TRANSLATION_SPECIAL_TOKENS, embedded_documents, load_or_train_tokenizer,
                         load_tokenizer, split_sentences, train_sentencepiece)
from jaxpos.data.tokenizer import sample_texts


@pytest.fixture(scope="module")
def sentences():
    return [s for d in embedded_documents() for s in split_sentences(d)]


def test_mlm_special_tokens_have_the_documented_ids(sentences, tmp_path):
    start = time.perf_counter()
    tokenizer = train_sentencepiece(sentences, str(tmp_path / "spm"), 2000)
    assert time.perf_counter() - start < 10  # seconds on the embedded corpus
    assert [tokenizer.id(t) for t in MLM_SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert [tokenizer.processor.id_to_piece(i) for i in range(5)] == list(MLM_SPECIAL_TOKENS)
    assert tokenizer.vocab_size == 2000 and tokenizer.num_special == 5
    ids = tokenizer.encode("The [MASK] statement binds [CLS] names [SEP] [PAD].")
    assert not set(ids) & {0, 2, 3, 4}  # literal special tokens in text are ordinary characters
    assert tokenizer.decode(tokenizer.encode("The statement binds names.")) == "The statement binds names."
    assert tokenizer.encode_batch(["a b", "c"]) == [tokenizer.encode("a b"), tokenizer.encode("c")]
    with pytest.raises(KeyError, match=r"\[BOS\] is not a special token"):
        tokenizer.id("[BOS]")


def test_translation_special_tokens_are_sentencepiece_bos_eos(sentences, tmp_path):
    tokenizer = train_sentencepiece(sentences[:500], str(tmp_path / "wmt"), 500,
                                    special_tokens=TRANSLATION_SPECIAL_TOKENS)
    assert [tokenizer.id(t) for t in TRANSLATION_SPECIAL_TOKENS] == [0, 1, 2, 3]
    ids = tokenizer.processor.encode("names", add_bos=True, add_eos=True)
    assert ids[0] == 2 and ids[-1] == 3
    with pytest.raises(ValueError, match=r"special tokens at ids .*'\[CLS\]': 1"):
        load_tokenizer(str(tmp_path / "wmt.model"))  # the MLM specials are not where jaxpos needs them
    with pytest.raises(ValueError, match="must include"):
        train_sentencepiece(sentences, str(tmp_path / "x"), 500, special_tokens=("[PAD]",))


def test_cached_tokenizer_is_reused_and_a_changed_one_refused(sentences, tmp_path):
    workdir = str(tmp_path)
    first, trained = load_or_train_tokenizer(workdir, iter(sentences), 1500)
    assert trained and first.path == os.path.join(workdir, "spm_mlm.model")
    modified = os.path.getmtime(first.path)
    again, trained = load_or_train_tokenizer(workdir, iter(sentences), 1500)
    assert not trained and os.path.getmtime(again.path) == modified
    assert again.encode("binding names") == first.encode("binding names")
    with pytest.raises(ValueError, match=r"other settings or data .*'vocab_size': \(1500, 1200\)"):
        load_or_train_tokenizer(workdir, iter(sentences), 1200)
    with pytest.raises(ValueError, match="'sha256'"):
        load_or_train_tokenizer(workdir, iter(sentences[1:]), 1500)
    loaded, trained = load_or_train_tokenizer(str(tmp_path / "other"), [], 99, model_path=first.path)
    assert not trained and loaded.vocab_size == first.vocab_size and not os.path.exists(tmp_path / "other")
    with pytest.raises(FileNotFoundError, match="missing.model"):
        load_tokenizer(str(tmp_path / "missing.model"))


def test_training_input_is_a_bounded_deterministic_sample():
    texts = [f"sentence {i}" for i in range(10_000)]
    sample = sample_texts(iter(texts), 100, seed=3)
    assert len(sample) == 100 and sample == sample_texts(texts, 100, seed=3)
    assert sample != sample_texts(texts, 100, seed=4)
    assert sorted(sample, key=lambda t: int(t.split()[1])) == sample  # reading order kept
    assert max(int(t.split()[1]) for t in sample) > 5_000  # drawn from the whole stream, not its head
    assert sample_texts(["a", " ", "", "b"], 10) == ["a", "b"]


def test_the_exported_transformers_tokenizer_gives_the_same_ids(sentences, tmp_path):
    """AutoTokenizer on the files written beside a Hugging Face export: the ids of Tokenizer.encode framed as
    [CLS] A [SEP] (B [SEP]) on the corpus's sentences and on text that exercises the normalisation. Where the two
    Viterbi searches meet a tie (e.g. "IEEE" as I·EE·E or I·E·EE: the same pieces, the same score), they may break
    it differently: such a sentence must give the same text and the same total score, and be rare."""
    transformers = pytest.importorskip("transformers")
    from jaxpos.data.tokenizer import CLS_ID, SEP_ID, transformers_tokenizer_files

    tokenizer = train_sentencepiece(sentences, str(tmp_path / "spm"), 2000)
    for name, text in transformers_tokenizer_files(tokenizer.path, 128).items():
        (tmp_path / name).write_text(text)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    awkward = ["  leading, double  and trailing spaces  ", "ﬁ ligature, Ｆｕｌｌｗｉｄｔｈ", "tab\tand\nnewline",
               "é accents ñ, ümlaut", "``quoted''", "", "3,5 digits 1,000"]
    scores = [tokenizer.processor.get_score(i) for i in range(tokenizer.vocab_size)]
    ties = 0
    for text in [*sentences[:3000], *awkward]:
        ours, got = [CLS_ID, *tokenizer.encode(text), SEP_ID], theirs(text)["input_ids"]
        if got != ours:
            ties += 1
            assert tokenizer.decode(got) == tokenizer.decode(ours), text
            assert sum(scores[i] for i in got) == pytest.approx(sum(scores[i] for i in ours), abs=1e-4), text
    assert ties <= 3
    pair = theirs("first part", "second part")
    assert pair["input_ids"] == [CLS_ID, *tokenizer.encode("first part"), SEP_ID, *tokenizer.encode("second part"),
                                 SEP_ID]
    assert pair["token_type_ids"] == [0] * (len(tokenizer.encode("first part")) + 2) + \
        [1] * (len(tokenizer.encode("second part")) + 1)
    assert theirs.mask_token_id == 4 and theirs.pad_token_id == 0
