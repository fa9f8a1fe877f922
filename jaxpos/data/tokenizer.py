"""A run's tokenizer: its vocabulary with fixed special-token ids, trained from a corpus and cached, or loaded from a
file. Two libraries train it (`data.tokenizer`): SentencePiece (a `.model`; unigram or BPE) and Hugging Face's
`tokenizers` (a `tokenizer.json`, what transformers' fast tokenizers and most encoders since 2024 ship; byte-level
BPE as RoBERTa and ModernBERT, or BERT's WordPiece). Both run offline.

Special tokens take the first ids, in the order given:

    MLM_SPECIAL_TOKENS:         [PAD]=0  [UNK]=1  [CLS]=2  [SEP]=3  [MASK]=4
    TRANSLATION_SPECIAL_TOKENS: [PAD]=0  [UNK]=1  [BOS]=2  [EOS]=3

Text can never produce a special token: a literal "[MASK]" in the corpus is tokenized as ordinary characters, so
the data cannot forge one. (SentencePiece: [PAD], [UNK], [BOS] and [EOS] are its own pad/unk/bos/eos pieces, the
others control symbols; tokenizers: they are read as text, `encode_special_tokens`.)

Model files may be local or at URLs that etils.epath handles (gs://, ...). A run trains its tokenizer once: on
process 0, while the other processes wait for the file (`load_or_train_tokenizer`), or beforehand with
`jaxpos tokenizer --config CFG --out PATH` (`train_tokenizer_file`) and `data.tokenizer_path=` the file it writes.
"""

from __future__ import annotations

import abc
import base64
import dataclasses
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
# The tokenizer a run trains and caches in its workdir, WORKDIR/<name><suffix of its library> with its settings in
# WORKDIR/<name>.json, by task.
RUN_TOKENIZER_NAMES = {"mlm": "spm_mlm", "translation": "spm_translation"}
TOKENIZER_SUFFIXES = {"sentencepiece": ".model", "tokenizers": ".tokenizer.json"}  # by data.tokenizer


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """Where a masked-LM vocabulary keeps the tokens that frame a row ([CLS] first, [SEP] last) and mask a token,
    and the ids that masking never chooses nor draws as a random replacement (`reserved`). jaxpos's vocabularies:
    the defaults; a Hugging Face folder's: its own (`jaxpos.data.hf_tokenizer.FolderTokenizer.special_ids`)."""

    cls: int = CLS_ID
    sep: int = SEP_ID
    mask: int = MASK_ID
    reserved: tuple[int, ...] = tuple(range(NUM_MLM_SPECIAL))


_NATIVE_PIECES = {"[PAD]": "pad", "[UNK]": "unk", "[BOS]": "bos", "[EOS]": "eos"}  # SentencePiece's own roles


def tokenizer_library(path: str) -> str:
    """The library whose file `path` is: "tokenizers" for a .json (tokenizer.json), else "sentencepiece"."""
    return "tokenizers" if str(path).endswith(".json") else "sentencepiece"


def tokenizer_prefix(out: str) -> str:
    """`out` without the suffix of a tokenizer file (.model, .tokenizer.json), as `jaxpos tokenizer --out` takes."""
    for suffix in sorted(TOKENIZER_SUFFIXES.values(), key=len, reverse=True):
        if out.endswith(suffix):
            return out[:-len(suffix)]
    return out


class Tokenizer(abc.ABC):
    """A run's vocabulary whose special tokens sit at ids 0..len(special_tokens)-1 (`SentencePieceTokenizer`,
    `FastTokenizer`): encode text -> ids without special tokens, decode ids -> text."""

    def __init__(self, path: str, special_tokens: Sequence[str]):
        self.path = path
        self.special_tokens = tuple(special_tokens)

    def _check_special_ids(self, token_id) -> None:
        found = {token: token_id(token) for token in self.special_tokens}
        if list(found.values()) != list(range(len(self.special_tokens))):
            raise ValueError(f"the tokenizer {self.path} has special tokens at ids {found}; jaxpos needs "
                             f"{dict(zip(self.special_tokens, range(len(self.special_tokens))))} "
                             "(train it with `jaxpos tokenizer` or jaxpos.data.train_sentencepiece)")

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of pieces, special tokens included (may be below the requested size for a small corpus)."""

    @property
    def num_special(self) -> int:
        return len(self.special_tokens)

    def id(self, token: str) -> int:
        """The id of a special token, e.g. `id("[MASK]") == 4`."""
        if token not in self.special_tokens:
            raise KeyError(f"{token} is not a special token of {self.path}; it has {self.special_tokens}")
        return self.special_tokens.index(token)

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens."""

    @abc.abstractmethod
    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of many texts at once (both libraries encode them on several threads)."""

    @abc.abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; special tokens but [UNK] decode to nothing."""

    @abc.abstractmethod
    def pieces(self) -> list[str]:
        """The vocabulary, id -> piece [vocab_size]."""

    @abc.abstractmethod
    def model_bytes(self) -> bytes:
        """The model file's contents: what identifies the vocabulary (a streaming run's fingerprint reads it)."""

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.path!r}, vocab_size={self.vocab_size}, "
                f"special_tokens={self.special_tokens})")


def read_tokenizer_json(data: bytes, path: str):
    """The `tokenizers.Tokenizer` of a tokenizer.json's bytes (read from `path`), with padding and truncation off (a
    file saved with them would pad or cut every text it encodes); a one-line ValueError naming `path` for a file the
    library cannot read."""
    import tokenizers  # lazy: runs with SentencePiece vocabularies do not need it

    try:
        tokenizer = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as error:  # noqa: BLE001 - the library's own message says what is wrong with the file
        raise ValueError(f"{path} does not read as a tokenizers tokenizer.json: "
                         f"{str(error).splitlines()[0]}") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _read_model(path: str, what: str) -> bytes:
    file = epath.Path(path)
    if not file.exists() or file.is_dir():
        raise FileNotFoundError(f"{what} {path!r} does not exist")
    return file.read_bytes()  # read through epath: URLs too


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece `.model` whose special tokens sit at ids 0..len(special_tokens)-1."""

    def __init__(self, model_path: str, special_tokens: Sequence[str] = MLM_SPECIAL_TOKENS):
        super().__init__(model_path, special_tokens)
        self.processor = spm.SentencePieceProcessor(model_proto=_read_model(model_path, "SentencePiece model"))
        self._check_special_ids(self.processor.piece_to_id)

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self.processor.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.processor.encode(texts) if texts else []

    def decode(self, ids: Iterable[int]) -> str:
        return self.processor.decode([int(i) for i in ids])  # control symbols ([CLS], [SEP], [MASK]) give nothing

    def pieces(self) -> list[str]:
        return [self.processor.id_to_piece(i) for i in range(self.vocab_size)]

    def model_bytes(self) -> bytes:
        return self.processor.serialized_model_proto()


class FastTokenizer(Tokenizer):
    """A `tokenizers` tokenizer.json (BPE, WordPiece or Unigram) whose special tokens sit at ids
    0..len(special_tokens)-1; ids are those transformers' PreTrainedTokenizerFast gives on the same file."""

    def __init__(self, path: str, special_tokens: Sequence[str] = MLM_SPECIAL_TOKENS):
        super().__init__(path, special_tokens)
        self._bytes = _read_model(path, "tokenizer file")
        self.backend = read_tokenizer_json(self._bytes, path)
        self.backend.encode_special_tokens = True  # "[MASK]" written in the text stays text
        self._check_special_ids(self.backend.token_to_id)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)] if texts else []

    def decode(self, ids: Iterable[int]) -> str:
        kept = [int(i) for i in ids if i >= self.num_special or self.special_tokens[i] == "[UNK]"]
        return self.backend.decode(kept, skip_special_tokens=False)  # [UNK] shows where a piece was unknown

    def pieces(self) -> list[str]:
        return [self.backend.id_to_token(i) for i in range(self.vocab_size)]

    def model_bytes(self) -> bytes:
        return self._bytes


def load_tokenizer(path: str, special_tokens: Sequence[str] = MLM_SPECIAL_TOKENS) -> Tokenizer:
    """Loads a SentencePiece `.model` or a `tokenizers` `.json` file (local or URL) and checks that its special
    tokens sit at the documented ids."""
    path = path if "://" in path else os.path.expanduser(path)
    kind = FastTokenizer if tokenizer_library(path) == "tokenizers" else SentencePieceTokenizer
    return kind(path, special_tokens)


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
    return SentencePieceTokenizer(model_prefix + ".model", special_tokens)


def _write_atomically(path: str, text: str) -> None:
    """`text` at `path` (local or URL); a concurrent reader never sees half of it."""
    if "://" in path:  # one object upload: atomic for readers of gs:// and the like
        epath.Path(path).parent.mkdir(parents=True, exist_ok=True)
        epath.Path(path).write_text(text)
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, encoding="utf-8") as f:
        f.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(f.name, 0o666 & ~umask)  # as a plain write would leave it, not the temporary file's 0600
    os.replace(f.name, path)


def _framing(special_tokens: Sequence[str]) -> dict | None:
    """The post-processor of a masked-LM tokenizer.json: [CLS] A [SEP], or [CLS] A [SEP] B [SEP] with token types
    0 and 1, as the model was trained (None for other special tokens: translation frames its own rows)."""
    if tuple(special_tokens) != MLM_SPECIAL_TOKENS:
        return None

    def piece(name: str, type_id: int) -> dict:
        return {"SpecialToken" if name.startswith("[") else "Sequence": dict(id=name, type_id=type_id)}

    return dict(type="TemplateProcessing",
                single=[piece("[CLS]", 0), piece("A", 0), piece("[SEP]", 0)],
                pair=[piece("[CLS]", 0), piece("A", 0), piece("[SEP]", 0), piece("B", 1), piece("[SEP]", 1)],
                special_tokens={t: dict(id=t, ids=[i], tokens=[t]) for t, i in (("[CLS]", CLS_ID), ("[SEP]", SEP_ID))})


def train_fast_tokenizer(texts: Iterable[str], path: str, vocab_size: int, *,
                         special_tokens: Sequence[str] = MLM_SPECIAL_TOKENS, model_type: str = "bpe",
                         max_sentences: int = 300_000, seed: int = 0) -> FastTokenizer:
    """Trains a `tokenizers` tokenizer on at most `max_sentences` of `texts` and writes it to `path` (a
    tokenizer.json, atomically). `model_type`: "bpe", byte-level as RoBERTa and ModernBERT (every text encodes,
    nothing is [UNK]), or "wordpiece", BERT's (cased: no lower-casing or accent stripping). `special_tokens` take
    ids 0.. in order; a masked-LM tokenizer frames rows [CLS] A [SEP] for transformers. The file is the same for the
    same sample for BPE; WordPiece's trainer breaks ties between equal counts in an order that varies from one
    training to the next, so two of its trainings may differ in a few pieces (a run keeps the one it cached)."""
    import tokenizers  # lazy: runs with SentencePiece vocabularies do not need it
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers  # lazy: the same

    special_tokens = list(special_tokens)
    least = len(special_tokens) + (256 if model_type == "bpe" else 0) + 1  # byte-level BPE keeps all 256 bytes
    if vocab_size < least:
        raise ValueError(f"vocab_size={vocab_size}: {model_type} needs at least {least} pieces beside "
                         f"{len(special_tokens)} special tokens" + (" (the 256 bytes and a merge)"
                                                                    if model_type == "bpe" else ""))
    sentences = sample_texts(texts, max_sentences, seed)
    if not sentences:
        raise ValueError("cannot train a tokenizer on an empty corpus")
    if model_type == "bpe":
        tokenizer = tokenizers.Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif model_type == "wordpiece":
        tokenizer = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False)
    else:
        raise ValueError(f"data.tokenizer_model_type={model_type!r}: tokenizers trains 'bpe' or 'wordpiece'")
    tokenizer.train_from_iterator(sentences, trainer)
    saved = json.loads(tokenizer.to_str())
    saved["post_processor"] = _framing(special_tokens)
    _write_atomically(path, json.dumps(saved, ensure_ascii=False))
    return FastTokenizer(path, special_tokens)


def tokenizer_settings(sentences: Iterable[str], vocab_size: int, *,
                       special_tokens: Sequence[str] = MLM_SPECIAL_TOKENS, model_type: str = "unigram",
                       max_sentences: int = 300_000, seed: int = 0,
                       library: str = "sentencepiece") -> tuple[list[str], dict]:
    """(training sample, settings): the sentences a tokenizer trains on (`sample_texts`) and what identifies the
    model it gives (the library, the settings and a hash of the sample), as saved beside it in `<prefix>.json`."""
    sample = sample_texts(sentences, max_sentences, seed)
    digest = hashlib.sha256()
    for sentence in sample:
        digest.update(sentence.encode("utf-8", errors="replace") + b"\n")
    settings = dict(vocab_size=vocab_size, special_tokens=list(special_tokens), model_type=model_type,
                    max_sentences=max_sentences, seed=seed, sentences=len(sample), sha256=digest.hexdigest())
    if library != "sentencepiece":  # SentencePiece's settings files predate the choice: they name no library
        settings["library"] = library
    return sample, settings


def settings_model_file(prefix: str, settings: dict) -> str:
    """The model file of the tokenizer `settings` describe: PREFIX.model or PREFIX.tokenizer.json."""
    return prefix + TOKENIZER_SUFFIXES[settings.get("library", "sentencepiece")]


def train_tokenizer_file(sample: list[str], settings: dict, model_prefix: str) -> Tokenizer:
    """Trains on `sample` with `settings` (from `tokenizer_settings`); writes the model (`<prefix>.model` and
    `.vocab`, or `<prefix>.tokenizer.json`), then `<prefix>.json` (the settings, written last: a process that sees it
    can read the model)."""
    options = dict(special_tokens=settings["special_tokens"], model_type=settings["model_type"],
                   max_sentences=settings["max_sentences"], seed=settings["seed"])
    if settings.get("library", "sentencepiece") == "tokenizers":
        tokenizer = train_fast_tokenizer(sample, settings_model_file(model_prefix, settings), settings["vocab_size"],
                                         **options)
    else:
        tokenizer = train_sentencepiece(sample, model_prefix, settings["vocab_size"], **options)
    epath.Path(model_prefix + ".json").write_text(json.dumps(settings, indent=1))
    return tokenizer


def load_or_train_tokenizer(workdir: str, sentences: Iterable[str], vocab_size: int, *,
                            model_path: str | None = None, name: str = RUN_TOKENIZER_NAMES["mlm"],
                            special_tokens: Sequence[str] = MLM_SPECIAL_TOKENS, model_type: str = "unigram",
                            max_sentences: int = 300_000, seed: int = 0, library: str = "sentencepiece",
                            process_index: int | None = None, process_count: int | None = None,
                            wait_s: float = 3600.0) -> tuple[Tokenizer, bool]:
    """The tokenizer of a run and whether it was trained now (by this process).

    `model_path` given: that file. Otherwise WORKDIR/<name>.model (`library` "tokenizers":
    WORKDIR/<name>.tokenizer.json), reused when its WORKDIR/<name>.json records the same library, settings and
    training sentences (a resumed run keeps its vocabulary), trained when absent. Only process 0 reads `sentences`
    and checks or trains; the others wait up to `wait_s` seconds for its settings file and load the model (the
    workdir must be shared, e.g. a gs:// bucket). A cached model made with other settings raises: a run's
    checkpoints only fit the vocabulary they were trained with.
    """
    if model_path:
        return load_tokenizer(model_path, special_tokens), False
    if process_index is None or process_count is None:
        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    prefix = os.path.join(workdir, name)
    model_file = prefix + TOKENIZER_SUFFIXES[library]
    settings_path = epath.Path(prefix + ".json")
    if process_index != 0:  # reads no sentences: process 0 checks or trains the model, then writes the settings
        deadline = time.monotonic() + wait_s
        while not settings_path.exists():
            if time.monotonic() > deadline:
                raise FileNotFoundError(
                    f"process {process_index} of {process_count} waited {wait_s:.0f} s for {model_file}, which "
                    "process 0 trains: every process must see the same workdir (a shared filesystem or a gs:// "
                    "bucket), or train the tokenizer beforehand with `jaxpos tokenizer --config CFG --out PATH` "
                    "and set data.tokenizer_path to the file it writes")
            time.sleep(min(1.0, wait_s / 10))
        return load_tokenizer(model_file, special_tokens), False
    sample, settings = tokenizer_settings(sentences, vocab_size, special_tokens=special_tokens, model_type=model_type,
                                          max_sentences=max_sentences, seed=seed, library=library)
    if settings_path.exists():  # checked before the model file: another library's model is another file
        cached = json.loads(settings_path.read_text())
        if cached != settings:
            changed = {k: (cached.get(k, "sentencepiece" if k == "library" else None), v)
                       for k, v in {**settings, "library": library}.items()
                       if cached.get(k, "sentencepiece" if k == "library" else None) != v}
            raise ValueError(f"{settings_model_file(prefix, cached)} was trained with other settings or data "
                             f"(cached, now): {changed}. Checkpoints in this workdir fit the old vocabulary: use a "
                             f"new workdir, or delete {prefix}.json to retrain")
        if epath.Path(model_file).exists():
            return load_tokenizer(model_file, special_tokens), False
    return train_tokenizer_file(sample, settings, prefix), True


def transformers_tokenizer_files(model_path: str, max_length: int) -> dict[str, str]:
    """{file name: text} of `tokenizer.json` and `tokenizer_config.json`, with which transformers' AutoTokenizer
    gives the ids of this masked-LM tokenizer (`Tokenizer.encode`) framed as the model was trained:
    [CLS] A [SEP], or [CLS] A [SEP] B [SEP] with token types 0 and 1. A `tokenizers` file is that file with this
    framing; a SentencePiece model is written as one: the same unigram vocabulary and scores, the
    model's own normalisation (its precompiled character map; extra spaces removed and a word boundary put first
    where the model does so) and its word-boundary marker; written as JSON, so exporting needs neither
    transformers nor tokenizers. One difference, as transformers users expect: a special token written in the text
    ("[MASK]", "[CLS]", "[SEP]", "[PAD]", "[UNK]") is that token there, where jaxpos reads its characters."""
    if tokenizer_library(model_path) == "tokenizers":  # the run's own tokenizer.json, framed as it trained
        tokenizer = json.loads(epath.Path(model_path).read_text())
        ids = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}
        if any(ids.get(t) != i for i, t in enumerate(MLM_SPECIAL_TOKENS)):
            raise ValueError(f"{model_path} is not a masked-LM tokenizer: its special tokens are {ids}")
        return _transformers_files(dict(tokenizer, post_processor=_framing(MLM_SPECIAL_TOKENS)), max_length)
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

    tokenizer = dict(version="1.0", truncation=None, padding=None, added_tokens=special,
                     normalizer=dict(type="Sequence", normalizers=normalizers), pre_tokenizer=word_start,
                     post_processor=_framing(MLM_SPECIAL_TOKENS), decoder=word_start,
                     model=dict(type="Unigram", unk_id=UNK_ID, byte_fallback=False,
                                vocab=[[p.piece, p.score] for p in proto.pieces]))
    return _transformers_files(tokenizer, max_length)


def _transformers_files(tokenizer: dict, max_length: int) -> dict[str, str]:
    """{file name: text}: the tokenizer.json `tokenizer` and the tokenizer_config.json that names its special tokens
    to transformers' PreTrainedTokenizerFast."""
    config = dict(tokenizer_class="PreTrainedTokenizerFast", model_max_length=max_length,
                  model_input_names=["input_ids", "token_type_ids", "attention_mask"],
                  **{f"{name}_token": f"[{name.upper()}]" for name in ("pad", "unk", "cls", "sep", "mask")})
    return {"tokenizer.json": json.dumps(tokenizer, ensure_ascii=False),
            "tokenizer_config.json": json.dumps(config, indent=2)}
