"""Models to analyse: a jaxpos masked-LM run's workdir, or a local Hugging Face BERT, ALBERT, DeBERTa-v2/v3 or
ModernBERT folder.

Both give an `AnalyzedModel`: the typed config, the `BertEncoder` parameters on the CPU, and (where the folder has
one) the vocabulary with a text -> ids function, so that every analysis sees one kind of object.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import jax
import numpy as np

from jaxpos.checkpoints.huggingface import bert_encoder_params, bert_pooler_params, folder_config, load_hf_checkpoint
from jaxpos.config import ModelConfig
from jaxpos.data.hf_tokenizer import folder_tokenizer
from jaxpos.data.tokenizer import CLS_ID, SEP_ID
from jaxpos.run import Run


@dataclasses.dataclass
class AnalyzedModel:
    name: str  # short name for output folders and titles
    source: str  # the workdir or folder it came from
    cfg: ModelConfig  # attention_impl='xla' and float32 (the analysis taps need the sown attention weights)
    params: dict  # `BertEncoder` parameters (numpy arrays on the host)
    vocabulary: list[str] | None = None  # id -> piece
    tokenize: Callable[[str], list[int]] | None = None  # text -> ids, no special tokens
    cls_id: int | None = None
    sep_id: int | None = None
    info: dict = dataclasses.field(default_factory=dict)  # where things came from (checkpoint step, files)
    pooler: dict | None = None  # a Hugging Face checkpoint's pooler {"kernel": [d, d], "bias": [d]}, if it has one

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` as the model saw them in training: [CLS] ids [SEP] (where it has those)."""
        if self.tokenize is None:
            raise ValueError(f"{self.source} has no tokenizer (vocab.txt / spiece.model / SentencePiece model)")
        ids = self.tokenize(text)
        return ([self.cls_id] if self.cls_id is not None else []) + ids + (
            [self.sep_id] if self.sep_id is not None else [])


def _for_analysis(cfg: ModelConfig) -> ModelConfig:
    """Only the xla attention implementation sows attention weights; analyses run in float32."""
    return dataclasses.replace(cfg, attention_impl="xla", dtype="float32")


# --- jaxpos runs -------------------------------------------------------------------------------------------------

def load_run(workdir: str) -> AnalyzedModel:
    """The encoder of a jaxpos masked-LM run (`jaxpos train --workdir DIR`, local or a URL): the typed config
    from WORKDIR/config.json, the parameters of the newest checkpoint that restores (parameters only, onto the
    CPU; nothing in the workdir is written), and the run's tokenizer."""
    run = Run.open(workdir, "mlm")
    cfg = run.model_config
    if cfg.num_decoder_layers:
        raise ValueError(f"{run.config_path}: an encoder-decoder (num_decoder_layers={cfg.num_decoder_layers}); "
                         "`jaxpos analyze` reads BERT-style encoders")
    step, params = run.params()
    params = jax.tree.map(np.asarray, params["bert"])  # the encoder; the MLM head is not analysed
    tokenizer = run.tokenizer()
    vocabulary = tokenizer.pieces()
    return AnalyzedModel(run.name, workdir, _for_analysis(cfg), params, vocabulary, tokenizer.encode, CLS_ID, SEP_ID,
                         info=dict(kind="jaxpos run", step=step, tokenizer=tokenizer.path))


# --- Hugging Face folders ----------------------------------------------------------------------------------------

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_OTHER_WEIGHTS = ("tf_model.h5", "flax_model.msgpack", "model.safetensors.index.json",
                  "pytorch_model.bin.index.json", "model.ckpt.index")


def load_hf(path: str) -> AnalyzedModel:
    """A local Hugging Face BERT, ALBERT, DeBERTa-v2 or ModernBERT folder (config.json + model.safetensors or
    pytorch_model.bin), with its vocabulary and tokenizer from tokenizer.json, vocab.txt or spiece.model when present
    (`jaxpos.data.hf_tokenizer`)."""
    if os.path.isdir(path) and not any(os.path.exists(os.path.join(path, f)) for f in _WEIGHT_FILES):
        other = [f for f in _OTHER_WEIGHTS if os.path.exists(os.path.join(path, f))]
        if other:
            raise ValueError(f"{os.path.join(path, other[0])}: jaxpos reads {' or '.join(_WEIGHT_FILES)} only "
                             "(save the model with transformers' save_pretrained from PyTorch)")
    hf_config, state = load_hf_checkpoint(path)  # names a missing config.json or weights file itself
    config_path = os.path.join(path, "config.json")
    cfg = folder_config(path, hf_config)
    weights = next(os.path.join(path, f) for f in _WEIGHT_FILES if os.path.exists(os.path.join(path, f)))
    try:
        params = bert_encoder_params(state, cfg)
    except KeyError as err:
        raise ValueError(f"{weights} does not fit {config_path}: {err.args[0]}") from err

    info = dict(kind="huggingface", model_type=hf_config.get("model_type", "bert"), weights=weights)
    tokenizer = folder_tokenizer(path, hf_config.get("model_type", "bert"))
    vocabulary = tokenize = cls_id = sep_id = None
    if tokenizer is not None:
        vocabulary, tokenize, cls_id, sep_id = tokenizer.vocabulary, tokenizer.encode, tokenizer.cls_id, \
            tokenizer.sep_id
        info["vocabulary"] = tokenizer.source
        tokenizer.check_fits(cfg.vocab_size, config_path)
    name = os.path.basename(os.path.normpath(os.path.abspath(path)))
    return AnalyzedModel(name, path, _for_analysis(cfg), params, vocabulary, tokenize, cls_id, sep_id, info,
                         bert_pooler_params(state))
