"""A trained run's workdir, local or a URL that etils.epath handles (gs://...), read in one place for every command
that reads runs (analyze, finetune --init, evaluate, translate, eval-bleu, export, reproduce):

    WORKDIR/config.json        the run's config; its `task` says what wrote it (mlm | translation | finetune;
                               runs that predate the field are masked-LM runs)
    WORKDIR/spm_<task>.model   the SentencePiece model a masked-LM or translation run trained, unless its
                               data.tokenizer_path named one; a fine-tuned run's is its encoder's (init.tokenizer)
    WORKDIR/checkpoints/<N>/   orbax checkpoints of the training state (jaxpos.training.checkpoint)

    run = Run.open("gs://bucket/runs/tiny")                # Run.open(path, "mlm") also checks the task
    run.task, run.model_config, run.steps(), run.tokenizer()
    step, params = run.params()                             # the newest checkpoint that restores, on the first CPU
    step, params = run.params(450, on=make_mesh(fsdp=2))   # step 450, placed as training places it

Nothing in the workdir is written.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from etils import epath

from jaxpos.config import ModelConfig
from jaxpos.config.files import apply_overrides, load_run_config
from jaxpos.config.run import TASKS, RunConfig, run_config
from jaxpos.data.classification import task_spec
from jaxpos.data.tokenizer import (MLM_SPECIAL_TOKENS, RUN_TOKENIZER_NAMES, TOKENIZER_SUFFIXES,
                                   TRANSLATION_SPECIAL_TOKENS, Tokenizer, load_tokenizer)
from jaxpos.models import BertForMaskedLM, BertForSequenceClassification, EncoderDecoder
from jaxpos.models.layout import to_unscanned
from jaxpos.sharding import placement
from jaxpos.training.checkpoint import abstract_like, checkpoint_path, read_run_params, saved_steps


def run_model(task: str, cfg: ModelConfig, num_labels: int | None = None) -> tuple[nn.Module, tuple]:
    """The flax module of a run of `task` (mlm | translation | finetune) and its init inputs (ids [1, n], n =
    cfg.max_length: parameter shapes depend on the config only)."""
    ids = jnp.zeros((1, cfg.max_length), jnp.int32)
    if task == "mlm":
        return BertForMaskedLM(cfg), (ids,)
    if task == "translation":
        return EncoderDecoder(cfg), (ids, ids)
    if task == "finetune":
        return BertForSequenceClassification(cfg, num_labels), (ids,)
    raise ValueError(f"unknown task {task!r}; jaxpos runs are {', '.join(TASKS)} runs")


@dataclasses.dataclass(frozen=True)
class Run:
    workdir: str  # as given: messages name it so
    config: RunConfig  # WORKDIR/config.json, with the overrides `open` was given

    @classmethod
    def open(cls, workdir, task: str | None = None, overrides: Sequence[str] = ()) -> Run:
        """The run in WORKDIR (a local folder or a URL), checked to be a run of `task` (None: any); `overrides`
        (`--config.a.b=value`) change its config as read, e.g. data paths or decoding settings. Raises
        FileNotFoundError for a missing workdir or config.json, ValueError for a run of another task."""
        workdir = os.fspath(workdir)
        config = apply_overrides(load_run_config(workdir, task), list(overrides))
        try:
            return cls(workdir, run_config(config, saved=True))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{epath.Path(workdir) / 'config.json'}: not a jaxpos run config: {err}") from err

    @property
    def path(self) -> epath.Path:
        return epath.Path(self.workdir)

    @property
    def config_path(self) -> epath.Path:
        return self.path / "config.json"

    @property
    def location(self) -> str:
        """The workdir made absolute where it is local; a URL as it is."""
        return os.fspath(checkpoint_path(self.workdir))

    @property
    def name(self) -> str:
        """The workdir's last component (for output folders and titles)."""
        return checkpoint_path(self.workdir).name

    @property
    def task(self) -> str:
        return self.config.task

    @property
    def model_config(self) -> ModelConfig:
        """The run's model as readers build it: unscanned and not rematerialised whatever it trained with (the
        computation is the same; `params` converts a scanned checkpoint), so every layer has its own subtree."""
        return dataclasses.replace(self.config.model, scan_layers=False, remat="none")

    @property
    def num_labels(self) -> int | None:
        """A fine-tuned run's outputs (its task's classes; 1 for regression); None for other runs."""
        if self.task != "finetune":
            return None

        return task_spec(self.config.data.task).num_labels

    def module(self) -> tuple[nn.Module, tuple]:
        """(the run's flax module, its init inputs): see `run_model`."""
        return run_model(self.task, self.model_config, self.num_labels)

    @property
    def tokenizer_file(self) -> epath.Path | None:
        """The tokenizer file of the run's token ids: data.tokenizer_path where the config names one, else the one
        training cached, WORKDIR/spm_<task>.model (data.tokenizer=tokenizers: spm_<task>.tokenizer.json); a
        fine-tuned run's is its encoder's (None for a Hugging Face encoder, whose folder holds its vocabulary)."""
        if self.task == "finetune":
            path = (self.config.init or {}).get("tokenizer")
            return epath.Path(path) if path else None
        named = self.config.data.tokenizer_path
        if named:
            return epath.Path(named)
        return self.path / f"{RUN_TOKENIZER_NAMES[self.task]}{TOKENIZER_SUFFIXES[self.config.data.tokenizer]}"

    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer with its task's special tokens, checked to fit the model's vocabulary."""
        path = self.tokenizer_file
        if path is None:
            raise FileNotFoundError(f"{self.config_path}: the encoder came from the Hugging Face folder "
                                    f"{(self.config.init or {}).get('path')}, which holds the run's vocabulary")
        if not path.is_file():
            raise FileNotFoundError(f"the run's tokenizer {path} is missing")
        special = TRANSLATION_SPECIAL_TOKENS if self.task == "translation" else MLM_SPECIAL_TOKENS
        tokenizer = load_tokenizer(os.fspath(path), special)
        vocab_size = self.model_config.vocab_size
        if tokenizer.vocab_size != vocab_size:
            raise ValueError(f"{path} has {tokenizer.vocab_size} pieces but the model in {self.config_path} has "
                             f"vocab_size={vocab_size}")
        return tokenizer

    def steps(self) -> list[int]:
        """The saved checkpoint steps, sorted. Raises FileNotFoundError when there is none."""
        return saved_steps(self.workdir)

    def params(self, step: int | None = None, on: jax.sharding.Mesh | jax.sharding.Sharding | jax.Device | None = None
               ) -> tuple[int, dict]:
        """(step, parameters) of checkpoint `step` (default: the newest that restores), without optimiser state,
        onto `on`: the first CPU (None), one jax.Device or jax.sharding.Sharding, or a (data, fsdp, tensor) Mesh
        as training shards them. Raises FileNotFoundError when there is no checkpoint, ValueError when none (or
        not `step`) restores for the run's model."""
        saved = self.config.model  # the layout the checkpoints hold
        module, init_args = run_model(self.task, dataclasses.replace(saved, remat="none"), self.num_labels)
        boxed = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *init_args))["params"]
        shardings = placement(boxed, jax.devices("cpu")[0] if on is None else on)
        step, params = read_run_params(self.workdir, abstract_like(nn.unbox(boxed), shardings), step)
        return int(step), to_unscanned(params) if saved.scan_layers else params
