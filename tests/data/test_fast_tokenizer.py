"""A run's vocabulary trained with Hugging Face `tokenizers` (data.tokenizer=tokenizers): byte-level BPE and
WordPiece against transformers' PreTrainedTokenizerFast on the same tokenizer.json (a peer reader of the file),
token for token; the cache, the refusals, and a run that trains, exports, analyses, fine-tunes and scores lengths
with it."""

import json
import os

import numpy as np
import pytest

from jaxpos.config.run import MLMDataConfig, TranslationDataConfig, tokenizer_algorithm
from jaxpos.data import CLS_ID, MASK_ID, MLM_SPECIAL_TOKENS, SEP_ID, load_or_train_tokenizer, load_tokenizer
from jaxpos.data.bible import edition_verses
from jaxpos.data.tokenizer import (FastTokenizer, TRANSLATION_SPECIAL_TOKENS, train_fast_tokenizer,
                                   transformers_tokenizer_files)

transformers = pytest.importorskip("transformers")

# Text the vocabulary never saw: other editions, accents, digits, other scripts, emoji, odd spacing.
UNSEEN = ["Über die Brücke gingen 12 345 Menschen, café naïve façade.", "Ελληνικά και русский текст 東京",
          "tabs\tand  double  spaces, trailing ", "emoji 🙂 and punctuation!? (yes) \"quoted\" -- dashes…",
          "CamelCaseWords and snake_case_names 3.14159", ""]


@pytest.fixture(scope="module")
def verses():
    web = list(edition_verses("web").values())
    return web[:3000], web[-200:] + list(edition_verses("kjv").values())[:200] + UNSEEN


@pytest.fixture(scope="module", params=["bpe", "wordpiece"])
def trained(request, verses, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param) / "vocab.tokenizer.json")
    return request.param, train_fast_tokenizer(verses[0], path, 1000, model_type=request.param)


def test_ids_equal_transformers_fast_tokenizer_token_for_token(trained, verses):
    model_type, ours = trained
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=ours.path)
    held_out = verses[1]
    expected = hf(held_out, add_special_tokens=False)["input_ids"]
    assert ours.encode_batch(held_out) == expected
    assert [ours.encode(t) for t in held_out] == expected
    assert ours.vocab_size == len(hf) == 1000
    assert ours.pieces() == hf.convert_ids_to_tokens(list(range(1000)))
    # The framing a masked-LM tokenizer carries: [CLS] A [SEP] and [CLS] A [SEP] B [SEP] with token types
    framed = hf(held_out[0], held_out[1], return_token_type_ids=True)
    a, b = ours.encode(held_out[0]), ours.encode(held_out[1])
    assert framed["input_ids"] == [CLS_ID, *a, SEP_ID, *b, SEP_ID]
    assert framed["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    for text in held_out[:50] + UNSEEN:
        assert ours.decode(ours.encode(text)) == hf.decode(hf(text, add_special_tokens=False)["input_ids"])
        assert ours.decode([CLS_ID, *ours.encode(text), SEP_ID, 0]) == ours.decode(ours.encode(text))
    if model_type == "bpe":  # byte-level: every text comes back exactly, nothing is [UNK]
        assert all(ours.decode(ours.encode(t)) == t for t in UNSEEN)
        assert not any(1 in ours.encode(t) for t in UNSEEN)


def test_special_tokens_sit_first_and_text_cannot_forge_them(trained):
    _, ours = trained
    assert [ours.backend.token_to_id(t) for t in MLM_SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    ids = ours.encode("The [MASK] statement binds [CLS] names [SEP] [PAD].")
    assert not set(ids) & {0, 2, 3, 4}
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=ours.path)
    assert MASK_ID in hf("a [MASK] b", add_special_tokens=False)["input_ids"]  # transformers reads it as the token
    assert ours.decode([CLS_ID, *ours.encode("In the beginning"), SEP_ID]) == "In the beginning"


def byte_level_bpe(text: str, vocab: dict, merges: list) -> list[int]:
    """GPT-2's byte-level BPE written out: its pre-tokenizing pattern, bytes shown as printable characters, then the
    lowest-ranked adjacent pair merged until none is left (an independent reading of the file's vocab and merges)."""
    regex = pytest.importorskip("regex")
    shown = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = {b: chr(b) for b in shown}
    extra = iter(range(256, 512))
    chars.update({b: chr(next(extra)) for b in range(256) if b not in chars})
    rank = {tuple(m.split(" ") if isinstance(m, str) else m): i for i, m in enumerate(merges)}
    ids = []
    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    for word in regex.findall(pattern, text):
        parts = [chars[b] for b in word.encode("utf-8")]
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: rank.get((parts[i], parts[i + 1]), len(rank)))
            if (parts[best], parts[best + 1]) not in rank:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        ids += [vocab[p] for p in parts]
    return ids


def test_ids_equal_an_independent_reading_of_the_file(trained, verses):
    """BPE against GPT-2's algorithm written out here; WordPiece against jaxpos's own BERT WordPiece
    (jaxpos/data/wordpiece.py, cased) on the file's vocabulary: the same ids on every held-out verse."""
    model_type, ours = trained
    with open(ours.path, encoding="utf-8") as f:
        model = json.load(f)["model"]
    texts = verses[1][:-len(UNSEEN)] + UNSEEN[:1] + UNSEEN[3:5]
    if model_type == "bpe":
        expected = [byte_level_bpe(t, model["vocab"], model["merges"]) for t in texts]
    else:
        from jaxpos.data.wordpiece import WordPiece

        wordpiece = WordPiece(ours.pieces(), lower_case=False)
        texts = [t for t in texts if t.isascii()]  # BERT's normaliser and jaxpos's agree on ASCII text
        expected = [wordpiece(t) for t in texts]
    assert len(texts) > 300 and ours.encode_batch(texts) == expected


def test_bpe_training_is_repeatable(verses, tmp_path):
    """The same sample gives the same file (WordPiece's trainer orders tied counts anew each time: its docstring)."""
    first = train_fast_tokenizer(verses[0][:1500], str(tmp_path / "first.tokenizer.json"), 600)
    again = train_fast_tokenizer(verses[0][:1500], str(tmp_path / "again.tokenizer.json"), 600)
    assert again.model_bytes() == first.model_bytes()
    with open(first.path, "rb") as f:
        assert f.read() == first.model_bytes()
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(first.path).st_mode & 0o777 == 0o666 & ~umask  # as a plain write leaves a file, not 0600
    with pytest.raises(ValueError, match="bpe needs at least 262 pieces beside 5 special tokens"):
        train_fast_tokenizer(verses[0][:10], str(tmp_path / "small.tokenizer.json"), 261)


def test_the_cache_is_reused_and_another_library_or_algorithm_refused(verses, tmp_path):
    sentences = verses[0][:800]
    first, trained = load_or_train_tokenizer(str(tmp_path), sentences, 400, library="tokenizers", model_type="bpe",
                                             process_index=0, process_count=1)
    assert trained and isinstance(first, FastTokenizer)
    assert sorted(os.listdir(tmp_path)) == ["spm_mlm.json", "spm_mlm.tokenizer.json"]
    again, trained = load_or_train_tokenizer(str(tmp_path), sentences, 400, library="tokenizers", model_type="bpe",
                                             process_index=0, process_count=1)
    assert not trained and again.model_bytes() == first.model_bytes()
    with pytest.raises(ValueError, match=r"other settings or data .*'library': \('tokenizers', 'sentencepiece'\)"):
        load_or_train_tokenizer(str(tmp_path), sentences, 400, model_type="bpe", process_index=0, process_count=1)
    with pytest.raises(ValueError, match=r"'model_type': \('bpe', 'wordpiece'\)"):
        load_or_train_tokenizer(str(tmp_path), sentences, 400, library="tokenizers", model_type="wordpiece",
                                process_index=0, process_count=1)
    assert sorted(os.listdir(tmp_path)) == ["spm_mlm.json", "spm_mlm.tokenizer.json"]  # nothing trained or lost
    waited, trained = load_or_train_tokenizer(str(tmp_path), [], 400, library="tokenizers", model_type="bpe",
                                              process_index=1, process_count=2, wait_s=1)
    assert not trained and waited.model_bytes() == first.model_bytes()  # another process reads process 0's file
    translation = train_fast_tokenizer(sentences, str(tmp_path / "wmt.tokenizer.json"), 300,
                                       special_tokens=TRANSLATION_SPECIAL_TOKENS)
    assert [translation.id(t) for t in TRANSLATION_SPECIAL_TOKENS] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"special tokens at ids .*'\[CLS\]': None, '\[SEP\]': None"):
        load_tokenizer(str(tmp_path / "wmt.tokenizer.json"))


@pytest.mark.parametrize("library, model_type, message", [
    ("spacy", "", "data.tokenizer='spacy'; choose 'sentencepiece' or 'tokenizers'"),
    ("tokenizers", "unigram", "data.tokenizer_model_type='unigram' is not an algorithm of data.tokenizer='tokenizers'"),
    ("sentencepiece", "wordpiece", "is not an algorithm of data.tokenizer='sentencepiece'; choose 'unigram' or 'bpe'"),
])
def test_a_library_or_algorithm_it_lacks_is_refused_in_one_line(library, model_type, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MLMDataConfig(tokenizer=library, tokenizer_model_type=model_type)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TranslationDataConfig(tokenizer=library, tokenizer_model_type=model_type)
    assert tokenizer_algorithm("tokenizers", "") == "bpe" and tokenizer_algorithm("sentencepiece", "") == "unigram"


def test_a_run_trains_exports_analyses_finetunes_and_scores_lengths_with_it(tmp_path):
    from jaxpos.analysis.loading import load_run
    from jaxpos.checkpoints.export import export_run
    from jaxpos.data.classification import jaxpos_tokenizer
    from jaxpos.evaluation.lengths import evaluate_lengths
    from jaxpos.run import Run
    from tests.helpers import train_tiny_mlm

    workdir = train_tiny_mlm(str(tmp_path / "run"), kind="absolute", data=dict(tokenizer="tokenizers"))
    run = Run.open(workdir)
    assert run.tokenizer_file.name == "spm_mlm.tokenizer.json" and not (run.path / "spm_mlm.model").exists()
    tokenizer = run.tokenizer()
    assert isinstance(tokenizer, FastTokenizer) and tokenizer.vocab_size == run.model_config.vocab_size == 300
    assert json.loads((run.path / "spm_mlm.json").read_text())["library"] == "tokenizers"
    model = load_run(workdir)  # analyze's reader: the vocabulary is the file's pieces
    assert model.vocabulary == tokenizer.pieces() and model.tokenize("In the beginning") == tokenizer.encode(
        "In the beginning")
    adapter = jaxpos_tokenizer(os.fspath(run.tokenizer_file))  # fine-tuning's reader of a jaxpos run's tokenizer
    assert adapter.encode("God said") == tokenizer.encode("God said") and adapter.vocab_size == 300
    out = tmp_path / "hf"
    export_run(workdir, str(out), format="huggingface")
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    text = "And God said, Let there be light: and there was light."
    assert hf(text)["input_ids"] == [CLS_ID, *tokenizer.encode(text), SEP_ID]
    assert hf.mask_token_id == MASK_ID and hf.pad_token_id == 0
    from jaxpos.config.defaults import mlm_config
    from jaxpos.workflows.tokenizer import train_config_tokenizer

    config = mlm_config()  # `jaxpos tokenizer` of the run's data block: the file the run trained, byte for byte
    config.data.update(seq_len=32, vocab_size=300, max_documents=20, tokenizer_max_sentences=2000,
                       tokenizer="tokenizers")
    ahead = train_config_tokenizer(config, str(tmp_path / "ahead" / "vocab"), "test")
    assert ahead.path.endswith("vocab.tokenizer.json") and ahead.model_bytes() == tokenizer.model_bytes()
    result = evaluate_lengths(run, [32, 64], max_tokens=2000)
    assert [e["length"] for e in result["lengths"]] == [32, 64]
    assert "skipped" in result["lengths"][1] and np.isfinite(result["lengths"][0]["loss"])  # learned table: 32
