"""SentencePiece tokenizers with fixed special-token ids, trained from a corpus and cached, or loaded from a file.

Special tokens take the first ids, in the order given to `train_sentencepiece`:

    MLM_SPECIAL_TOKENS:         [PAD]=0  [UNK]=1  [CLS]=2  [SEP]=3  [MASK]=4
    TRANSLATION_SPECIAL_TOKENS: [PAD]=0  [UNK]=1  [BOS]=2  [EOS]=3

[PAD], [UNK], [BOS] and [EOS] become SentencePiece's own pad/unk/bos/eos pieces (so `encode(..., add_bos=True)`
works); the others are control symbols, which text can never produce: a literal "[MASK]" in the corpus is
tokenized as ordinary characters, so the data cannot forge a special token.

Model files may be local or at URLs that etils.epath handles (gs://, ...). A run trains its tokenizer once: on
process 0, while the other processes wait for the file (`load_or_train_tokenizer`), or beforehand with
`jaxpos tokenizer --config CFG --out PATH` (`train_tokenizer_file`) and `data.tokenizer_path=PATH.model`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
import time
from typing import Iterable, Sequence

import jax
import numpy as np
import sentencepiece as spm
from etils import epath

from jaxpos.config.rng import TOKENIZER_SAMPLE

MLM_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TRANSLATION_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[BOS]", "[EOS]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(5)
NUM_MLM_SPECIAL = len(MLM_SPECIAL_TOKENS)
# The tokenizer a run trains and caches in its workdir, WORKDIR/<name>.model (with .vocab and .json), by task.
RUN_TOKENIZER_NAMES = {"mlm": "spm_mlm", "translation": "spm_translation"}

_NATIVE_PIECES = {"[PAD]": "pad", "[UNK]": "unk", "[BOS]": "bos", "[EOS]": "eos"}  # SentencePiece's own roles


class Tokenizer:
    """A SentencePiece model whose special tokens sit at ids 0..len(special_tokens)-1."""

    def __init__(self, model_path: str, special_tokens: Sequence[str] = MLM_SPECIAL_TOKENS):
        path = epath.Path(model_path)
        if not path.exists() or path.is_dir():
            raise FileNotFoundError(f"SentencePiece model {model_path!r} does not exist")
        self.path = model_path
        self.processor = spm.SentencePieceProcessor(model_proto=path.read_bytes())  # read through epath: URLs too
        self.special_tokens = tuple(special_tokens)
        found = [self.processor.piece_to_id(token) for token in self.special_tokens]
        if found != list(range(len(self.special_tokens))):
            have = {token: self.processor.piece_to_id(token) for token in self.special_tokens}
            raise ValueError(f"SentencePiece model {model_path} has special tokens at ids {have}; jaxpos needs "
                             f"{dict(zip(self.special_tokens, range(len(self.special_tokens))))} "
                             "(train it with jaxpos.data.train_sentencepiece)")

    @property
    def vocab_size(self) -> int:
        """Number of pieces, special tokens included (may be below the requested size for a small corpus)."""
        return self.processor.get_piece_size()

    @property
    def num_special(self) -> int:
        return len(self.special_tokens)

    def id(self, token: str) -> int:
        """The id of a special token, e.g. `id("[MASK]") == 4`."""
        if token not in self.special_tokens:
            raise KeyError(f"{token} is not a special token of {self.path}; it has {self.special_tokens}")
        return self.special_tokens.index(token)

    def encode(self, text: str) -> list[int]:
        return self.processor.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of many texts at once (SentencePiece encodes them on several threads)."""
        return self.processor.encode(texts) if texts else []

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; control symbols ([CLS], [SEP], [MASK]) decode to nothing."""
        return self.processor.decode([int(i) for i in ids])

    def __repr__(self) -> str:
        return f"Tokenizer({self.path!r}, vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"


def load_tokenizer(path: str, special_tokens: Sequence[str] = MLM_SPECIAL_TOKENS) -> Tokenizer:
    """Loads a `.model` file (local or URL) and checks that its special tokens sit at the documented ids."""
    return Tokenizer(path if "://" in path else os.path.expanduser(path), special_tokens)


def sample_texts(texts: Iterable[str], max_texts: int, seed: int = 0) -> list[str]:
    """At most `max_texts` non-empty texts, a uniform reservoir sample in reading order; memory stays bounded."""
    rng = np.random.default_rng([seed, TOKENIZER_SAMPLE])
    reservoir: list[tuple[int, str]] = []
    for index, text in enumerate(t.strip() for t in texts):
        if not text:
            continue
        if len(reservoir) < max_texts:
            reservoir.append((index, text))
        else:
            slot = int(rng.integers(0, index + 1))
            if slot < max_texts:
                reservoir[slot] = (index, text)
    return [text for _, text in sorted(reservoir)]


def train_sentencepiece(texts: Iterable[str], model_prefix: str, vocab_size: int, *,
                        special_tokens: Sequence[str] = MLM_SPECIAL_TOKENS, model_type: str = "unigram",
                        max_sentences: int = 300_000, character_coverage: float = 0.9995,
                        seed: int = 0, num_threads: int = 1) -> Tokenizer:
    """Trains SentencePiece on at most `max_sentences` of `texts` (one sentence or line each) and writes
    `model_prefix.model` / `.vocab` atomically. `special_tokens` take ids 0.. in order; [UNK] is required.
    `vocab_size` is an upper bound: a small corpus gives fewer pieces (see `Tokenizer.vocab_size`).
    The model is the same on every machine for the same `num_threads` (SentencePiece's result depends on it,
    so it is a fixed argument, not the core count; one thread trains the embedded corpus in under a second)."""
    special_tokens = tuple(special_tokens)
    if "[UNK]" not in special_tokens:
        raise ValueError(f"special_tokens {special_tokens} must include [UNK] (SentencePiece needs one)")
    if vocab_size <= len(special_tokens):
        raise ValueError(f"vocab_size={vocab_size} leaves no room beside {len(special_tokens)} special tokens")
    sentences = sample_texts(texts, max_sentences, seed)
    if not sentences:
        raise ValueError("cannot train a SentencePiece model on an empty corpus")
    roles = {f"{role}_id": -1 for role in ("pad", "bos", "eos")}
    control_symbols = []
    for token_id, token in enumerate(special_tokens):
        if token in _NATIVE_PIECES:
            role = _NATIVE_PIECES[token]
            roles[f"{role}_id"], roles[f"{role}_piece"] = token_id, token
        else:
            control_symbols.append(token)  # SentencePiece fills the free low ids with these, in order
    remote = "://" in model_prefix
    directory = None if remote else os.path.dirname(os.path.abspath(model_prefix))
    if remote:
        epath.Path(model_prefix).parent.mkdir(parents=True, exist_ok=True)
    else:
        os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:  # SentencePiece writes local files only
        scratch_prefix = os.path.join(scratch, "spm")
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_prefix=scratch_prefix, vocab_size=vocab_size,
            model_type=model_type, control_symbols=control_symbols, hard_vocab_limit=False,
            character_coverage=character_coverage, input_sentence_size=0, shuffle_input_sentence=False,
            max_sentence_length=1 << 16, num_threads=num_threads,
            minloglevel=2, **roles)
        for suffix in (".vocab", ".model"):  # a concurrent reader never sees a half-written model
            if remote:  # one object upload: atomic for readers of gs:// and the like
                epath.Path(model_prefix + suffix).write_bytes(epath.Path(scratch_prefix + suffix).read_bytes())
            else:
                os.replace(scratch_prefix + suffix, model_prefix + suffix)
    return Tokenizer(model_prefix + ".model", special_tokens)


def tokenizer_settings(sentences: Iterable[str], vocab_size: int, *,
                       special_tokens: Sequence[str] = MLM_SPECIAL_TOKENS, model_type: str = "unigram",
                       max_sentences: int = 300_000, seed: int = 0) -> tuple[list[str], dict]:
    """(training sample, settings): the sentences a tokenizer trains on (`sample_texts`) and what identifies the
    model it gives (the settings and a hash of the sample), as saved beside it in `<prefix>.json`."""
    sample = sample_texts(sentences, max_sentences, seed)
    digest = hashlib.sha256()
    for sentence in sample:
        digest.update(sentence.encode("utf-8", errors="replace") + b"\n")
    settings = dict(vocab_size=vocab_size, special_tokens=list(special_tokens), model_type=model_type,
                    max_sentences=max_sentences, seed=seed, sentences=len(sample), sha256=digest.hexdigest())
    return sample, settings


def train_tokenizer_file(sample: list[str], settings: dict, model_prefix: str) -> Tokenizer:
    """Trains on `sample` with `settings` (from `tokenizer_settings`); writes `<prefix>.model`, `.vocab`, then
    `.json` (the settings, written last: a process that sees it can read the model)."""
    tokenizer = train_sentencepiece(sample, model_prefix, settings["vocab_size"],
                                    special_tokens=settings["special_tokens"], model_type=settings["model_type"],
                                    max_sentences=settings["max_sentences"], seed=settings["seed"])
    epath.Path(model_prefix + ".json").write_text(json.dumps(settings, indent=1))
    return tokenizer


def load_or_train_tokenizer(workdir: str, sentences: Iterable[str], vocab_size: int, *,
                            model_path: str | None = None, name: str = RUN_TOKENIZER_NAMES["mlm"],
                            special_tokens: Sequence[str] = MLM_SPECIAL_TOKENS, model_type: str = "unigram",
                            max_sentences: int = 300_000, seed: int = 0, process_index: int | None = None,
                            process_count: int | None = None, wait_s: float = 3600.0) -> tuple[Tokenizer, bool]:
    """The tokenizer of a run and whether it was trained now (by this process).

    `model_path` given: that file. Otherwise WORKDIR/<name>.model, reused when its WORKDIR/<name>.json records
    the same settings and training sentences (a resumed run keeps its vocabulary), trained when absent. Only
    process 0 reads `sentences` and checks or trains; the others wait up to `wait_s` seconds for its settings
    file and load the model (the workdir must be shared, e.g. a gs:// bucket). A cached model made with other
    settings raises: a run's checkpoints only fit the vocabulary they were trained with.
    """
    if model_path:
        return load_tokenizer(model_path, special_tokens), False
    if process_index is None or process_count is None:
        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    prefix = os.path.join(workdir, name)
    settings_path = epath.Path(prefix + ".json")
    if process_index != 0:  # reads no sentences: process 0 checks or trains the model, then writes the settings
        deadline = time.monotonic() + wait_s
        while not settings_path.exists():
            if time.monotonic() > deadline:
                raise FileNotFoundError(
                    f"process {process_index} of {process_count} waited {wait_s:.0f} s for {prefix}.model, which "
                    "process 0 trains: every process must see the same workdir (a shared filesystem or a gs:// "
                    "bucket), or train the tokenizer beforehand with `jaxpos tokenizer --config CFG --out PATH` "
                    "and set data.tokenizer_path=PATH.model")
            time.sleep(min(1.0, wait_s / 10))
        return load_tokenizer(prefix + ".model", special_tokens), False
    sample, settings = tokenizer_settings(sentences, vocab_size, special_tokens=special_tokens,
                                          model_type=model_type, max_sentences=max_sentences, seed=seed)
    if epath.Path(prefix + ".model").exists() and settings_path.exists():
        cached = json.loads(settings_path.read_text())
        if cached != settings:
            changed = {k: (cached.get(k), v) for k, v in settings.items() if cached.get(k) != v}
            raise ValueError(f"{prefix}.model was trained with other settings or data (cached, now): {changed}. "
                             "Checkpoints in this workdir fit the old vocabulary: use a new workdir, or delete "
                             f"{prefix}.model to retrain")
        return load_tokenizer(prefix + ".model", special_tokens), False
    return train_tokenizer_file(sample, settings, prefix), True


def transformers_tokenizer_files(model_path: str, max_length: int) -> dict[str, str]:
    """{file name: text} of `tokenizer.json` and `tokenizer_config.json`, with which transformers' AutoTokenizer
    gives the ids of this masked-LM SentencePiece model (`Tokenizer.encode`) framed as the model was trained:
    [CLS] A [SEP], or [CLS] A [SEP] B [SEP] with token types 0 and 1. The same unigram vocabulary and scores, the
    model's own normalisation (its precompiled character map; extra spaces removed and a word boundary put first
    where the model does so) and its word-boundary marker; written as JSON, so exporting needs neither
    transformers nor tokenizers. One difference, as transformers users expect: a special token written in the text
    ("[MASK]", "[CLS]", "[SEP]", "[PAD]", "[UNK]") is that token there, where SentencePiece reads its characters."""
    from sentencepiece import sentencepiece_model_pb2  # lazy: protobuf, which only exports need

    proto = sentencepiece_model_pb2.ModelProto.FromString(epath.Path(model_path).read_bytes())
    if proto.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
        raise ValueError(f"{model_path} is not a unigram SentencePiece model; the Hugging Face tokenizer files "
                         "are written for unigram models (data.tokenizer_model_type='unigram')")
    pieces = [p.piece for p in proto.pieces]
    if tuple(pieces[:NUM_MLM_SPECIAL]) != MLM_SPECIAL_TOKENS:
        raise ValueError(f"{model_path} is not a masked-LM tokenizer: its first pieces are {pieces[:NUM_MLM_SPECIAL]}")
    special = [dict(id=i, content=t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
               for i, t in enumerate(MLM_SPECIAL_TOKENS)]
    spec = proto.normalizer_spec
    word_start = dict(type="Metaspace", replacement="\u2581", split=True,
                      prepend_scheme="always" if spec.add_dummy_prefix else "never")
    normalizers = [dict(type="Replace", pattern=dict(Regex=" {2,}"), content=" "),
                   dict(type="Strip", strip_left=True, strip_right=True)] if spec.remove_extra_whitespaces else []
    if spec.precompiled_charsmap:
        charsmap = base64.b64encode(spec.precompiled_charsmap).decode()
        normalizers.insert(0, dict(type="Precompiled", precompiled_charsmap=charsmap))

    def piece(name: str, type_id: int) -> dict:
        return {"SpecialToken" if name.startswith("[") else "Sequence": dict(id=name, type_id=type_id)}

    framing = dict(type="TemplateProcessing",
                   single=[piece("[CLS]", 0), piece("A", 0), piece("[SEP]", 0)],
                   pair=[piece("[CLS]", 0), piece("A", 0), piece("[SEP]", 0), piece("B", 1), piece("[SEP]", 1)],
                   special_tokens={t: dict(id=t, ids=[i], tokens=[t]) for t, i in (("[CLS]", CLS_ID),
                                                                                   ("[SEP]", SEP_ID))})
    tokenizer = dict(version="1.0", truncation=None, padding=None, added_tokens=special,
                     normalizer=dict(type="Sequence", normalizers=normalizers), pre_tokenizer=word_start,
                     post_processor=framing, decoder=word_start,
                     model=dict(type="Unigram", unk_id=UNK_ID, byte_fallback=False,
                                vocab=[[p.piece, p.score] for p in proto.pieces]))
    config = dict(tokenizer_class="PreTrainedTokenizerFast", model_max_length=max_length,
                  model_input_names=["input_ids", "token_type_ids", "attention_mask"],
                  **{f"{name}_token": f"[{name.upper()}]" for name in ("pad", "unk", "cls", "sep", "mask")})
    return {"tokenizer.json": json.dumps(tokenizer, ensure_ascii=False),
            "tokenizer_config.json": json.dumps(config, indent=2)}
