"""The run matrix of `jaxpos reproduce` and its fixed recipes (profiles): what runs, never where or how.

Every mechanism is pretrained with its profile's recipe (steps x batch x seq_len, learning rate), once per seed;
the seed sets the initialisation, the data order and the masking, so runs with the same seed are paired. The seeds
of a mechanism pretrain at once, in one program (`pretraining_groups`); each run then executes only the stages the
chosen claims need of its mechanism (`STAGES`). A finished run's result.json is reused and an unfinished one
resumes from its checkpoints, so running the command again resumes. jaxpos.reproduction.pool executes the plan on
this host's worker processes; launch/reproduce.sbatch spreads its groups over a SLURM job array instead.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
import time
from typing import Mapping, Sequence

from jaxpos.config.position import PositionConfig
from jaxpos.config.checks import unknown_field
from jaxpos.config.model import ModelConfig
from jaxpos.config.run import FinetuneDataConfig, MLMDataConfig, TrainConfig
from jaxpos.config.files import apply_overrides, load_config, write_json_atomically
from jaxpos.positions import MECHANISMS, mechanism as registered
from jaxpos.reproduction.host import machine

PLAN_FILE = "plan.json"
RESULT_FILE = "result.json"
FAILED_FILE = "failed.txt"
LOG_FILE = "run.log"
# What a run does beyond pretraining and its learning curve, each only where a chosen claim needs it:
#   finetune      fine-tuning on the paraphrase task (dev accuracy)
#   probe         Chen et al.'s word-order probe of the fine-tuned model (needs finetune)
#   last          the analyses (Toeplitz R², locality, symmetry, rank, decomposition) at the last checkpoint
#   over_training the same at every analysed checkpoint (the last included)
#   final         effective attention and token identifiability at the last checkpoint
#   lengths       the held-out masked-LM loss at the last checkpoint at 1x, 2x, 4x the training length
#   order         fine-tuning on the word-order pair task (bible_order) at each learning rate of the profile's
#                 grid: the best dev accuracy over evaluations and rates, the papers' protocol
STAGES = ("finetune", "probe", "last", "over_training", "final", "lengths", "order")


@dataclasses.dataclass(frozen=True)
class RunMechanism:
    """A mechanism as the reproduction runs it: a registry kind under some options."""

    name: str
    label: str  # as the report names it
    position: dict  # the model.position block (kind and options)
    learned: bool  # has learned positional parameters (Chen's "learned encodings")
    model: dict = dataclasses.field(default_factory=dict)  # other config.model fields it sets (a local window)


def run_mechanism(name: str, position: dict, label: str | None = None, model: dict | None = None) -> RunMechanism:
    """The run `name` of the position block `position`; `learned` from the registry, and its label unless given."""
    record = registered(position["kind"])
    return RunMechanism(name, label or record.label, position,
                        record.is_learned(PositionConfig.from_values(position).options),
                        dict(model or {}))


# The runs of a kind beside its own (named after the kind, with the registry's label and default options):
# (name, label, options).
RUN_VARIANTS = {
    "tisa": [("tisa_input", "TISA + input positions", dict(tisa=dict(input_positions=True)))],
    "diet_rel": [("diet_rel_layer", "DIET-Rel, shared by layer", dict(diet_rel=dict(sharing="layer")))],
    "diet_abs": [("diet_abs_unshared", "DIET-Abs, unshared", dict(diet_abs=dict(sharing="none"))),
                 ("diet_abs_segments", "DIET-Abs, shared by layer, per-head segments",
                  dict(diet_abs=dict(sharing="layer"), segment="per_head"))],
    "attenuated": [("attenuated_learned", "attenuated, learnable (n x n per head)",
                    dict(attenuated=dict(form="matrix")))],
}

# Every registered mechanism, each followed by its variants.
RUN_MECHANISMS = {run.name: run for kind in MECHANISMS for run in (
    run_mechanism(kind, dict(kind=kind)),
    *(run_mechanism(name, dict(kind=kind, **options), label) for name, label, options in RUN_VARIANTS.get(kind, ())))}
BAG_OF_WORDS = "none"  # the baseline every learning curve is judged against
TIMING_MECHANISM = "tisa"  # timed for the estimate: a logit-bias mechanism, its step costs what most runs' do

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


@dataclasses.dataclass(frozen=True)
class Profile:
    """A fixed recipe: model, pretraining and fine-tuning data and steps, evaluation points and analysis sizes.
    Nothing in it depends on the machine."""

    name: str
    purpose: str  # one line: what the profile is for
    mechanisms: tuple[str, ...]  # the matrix when no --mechanisms is given
    seeds: int  # seeds when no --seeds is given
    model: dict  # config.model overrides of configs/mlm/tiny.py
    data: dict  # config.data overrides (the pretraining corpus)
    train: dict  # config.train overrides: num_steps, batch_size, learning_rate, ...
    finetune_data: dict  # config.data overrides of configs/finetune/paraphrase.py
    finetune_train: dict  # config.train overrides: num_steps, batch_size, learning_rate
    analysis: dict  # report.analyze options
    max_sentences: int  # held-out sentences the analyses read
    probe_examples: int  # paraphrase test pairs of the word-order probe
    curve_points: int = 8  # held-out MLM loss at this many evenly spaced steps: the learning curve
    analysis_points: int = 4  # of those checkpoints, this many evenly spaced ones (the last included) analysed
    eval_batches: int = 8  # held-out batches behind each point of the curve
    order_data: dict | None = None  # config.data overrides of the order task over finetune_data's
    order_train: dict | None = None  # config.train overrides of the order task (None: finetune_train's)
    order_learning_rates: tuple[float, ...] = ()  # the order task's grid (): order_train's learning rate alone
    length_factors: tuple[int, ...] = (1, 2, 4)  # the `lengths` stage: multiples of the training length
    length_tokens: int = 65536  # ... scoring the first this many held-out tokens at every length (the same masked
    # ones at each: 9,772 at the full recipe, where 8,192 tokens gave about 1,230 and a standard error near 0.1 nat)
    timing_steps: int = 6  # training steps of the timing that estimates the wall time
    xla_flags: str = ""  # added to XLA_FLAGS in each worker
    # The recipe's base: a config file (configs/... of the repository, or a path) and `--config.a.b=value`
    # overrides applied to it before the blocks above (`jaxpos compare`: the user's config and overrides).
    config: str = "configs/mlm/tiny.py"
    overrides: tuple[str, ...] = ()
    # Mechanisms of this profile beyond the registry's runs: {name: {"position", "label", "model", "eval"}}, where
    # "eval" holds {label: overrides} of rules applied at evaluation only (RoPE's length rules: `jaxpos compare`).
    variants: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        # Each override block names fields of its typed config: a misspelt one fails here, not deep in a run.
        blocks = (("model", self.model, ModelConfig), ("data", self.data, MLMDataConfig),
                  ("train", self.train, TrainConfig), ("finetune_data", self.finetune_data, FinetuneDataConfig),
                  ("finetune_train", self.finetune_train, TrainConfig),
                  ("order_data", self.order_data or {}, FinetuneDataConfig),
                  ("order_train", self.order_train or {}, TrainConfig))
        for block, overrides, typed_config in blocks:
            known = {field.name for field in dataclasses.fields(typed_config)}
            for key in overrides:
                if key not in known:
                    raise unknown_field(f"profile {self.name}: {block}", key, known)

    @property
    def steps(self) -> int:
        return int(self.train["num_steps"])

    def order_recipe(self) -> dict:
        """config.train overrides of the order task: order_train over finetune_train."""
        return dict(self.finetune_train, **(self.order_train or {}))

    def order_inputs(self) -> dict:
        """config.data overrides of the order task: order_data over finetune_data."""
        return dict(self.finetune_data, **(self.order_data or {}))

    def order_rates(self) -> tuple[float, ...]:
        """The order task's learning-rate grid (its recipe's rate where the profile gives none)."""
        return self.order_learning_rates or (self.order_recipe()["learning_rate"],)

    def curve_steps(self) -> list[int]:
        """The steps of the learning curve (checkpoints kept at each): [curve_points]."""
        every = self.steps // self.curve_points
        return [every * (k + 1) for k in range(self.curve_points)]

    def analysis_steps(self) -> list[int]:
        """The checkpoints analysed over training: every (curve_points / analysis_points)-th step of the curve."""
        stride = self.curve_points // self.analysis_points
        return self.curve_steps()[stride - 1::stride]

    def check(self) -> None:
        """Raises ValueError for a recipe whose curve or analysis points do not divide its steps."""
        if self.steps % self.curve_points or self.curve_points % self.analysis_points:
            raise ValueError(f"profile {self.name}: {self.steps} steps, {self.curve_points} curve points and "
                             f"{self.analysis_points} analysis points must divide each other")
        unknown = [m for m in self.mechanisms if m not in RUN_MECHANISMS and m not in self.variants]
        if unknown:
            raise ValueError(f"profile {self.name}: unknown mechanisms {unknown}")


_TINY_ANALYSIS = dict(num_probe_words=16, probe_length=128, lengths=(16, 32, 64, 128), windows=2, probe_epochs=10,
                      probe_patience=3, probe_learning_rate=3e-3, decomposition_sentences=8)
PROFILES = {
    # The recipe the verdicts are for: configs/mlm/tiny.py (d = 128, L = 2, H = 4, D = 32) on 128-token rows of
    # three English Bibles (2.8M tokens), 64 rows a step. At 16 rows a step DIET-Rel's held-out loss parts from
    # the bag-of-words model's between steps 1,000 and 2,000 and learned absolute positions had not parted by
    # step 4,000; 64 rows a step cost a GPU no more time per step (a tiny model is latency-bound) and bring the
    # parting forward, so 4,000 steps leave the slow mechanisms a margin (on an H200, learned absolute positions
    # part by step 1,600). Fine-tuning: 600 steps of 32 pairs on the paraphrase task. On the word-order task
    # learned absolute positions stay at chance for 6,000 steps of 32 pairs and learn it after (0.714 at step
    # 18,000 on 2026-11-27; at 1,200 steps of 4,000 pairs, at rates from 3e-4 to 3e-3, no input positions learned
    # it), so it reads all its training pairs for 20,000 steps, at one rate: a grid at that length would triple what
    # is already most of the profile's time. Sinusoidal positions reached 0.540 at best with it.
    "full": Profile(
        "full", "the verdicts: every mechanism, 5 seeds; about 1.5 hours of one GPU host (estimated; the word-order "
        "task's 20,000 steps a run are most of it), days on 2 CPU cores",
        tuple(RUN_MECHANISMS), 5,
        model=dict(max_length=128),
        data=dict(source="bible", bible_editions=("web", "kjv", "bbe"), seq_len=128, vocab_size=4000),
        train=dict(num_steps=4000, batch_size=64, learning_rate=2e-3, warmup_fraction=0.05, max_predictions=32),
        finetune_data=dict(max_length=128, offline_train_examples=4000, offline_dev_examples=1000,
                           offline_test_examples=1000),
        finetune_train=dict(num_steps=600, batch_size=32, learning_rate=1e-3),
        order_data=dict(offline_train_examples=0), order_train=dict(num_steps=20000, batch_size=32, learning_rate=3e-4),
        analysis=_TINY_ANALYSIS, max_sentences=64, probe_examples=1000, curve_points=10, analysis_points=5,
        timing_steps=40),
    # A first look in minutes on 2 CPU cores: a d = 64 model on 64-token rows of one Bible, 2 seeds, four
    # mechanisms. Its models are judged as untrained where they are: the verdicts are the full profile's to give.
    "smoke": Profile(
        "smoke", "a first look: a small model, 4 mechanisms, 2 seeds, a few minutes on 2 CPU cores",
        ("none", "absolute", "tisa", "diet_rel"), 2,
        model=dict(d_model=64, num_layers=2, num_heads=4, mlp_dim=128, max_length=64, dropout=0.0,
                   attention_dropout=0.0),
        # eval_fraction >= the fine-tuning's dev + test fractions: pretraining never reads their chapters
        data=dict(source="bible", bible_editions=("web",), max_documents=400, eval_fraction=0.2, seq_len=64,
                  vocab_size=2000),
        train=dict(num_steps=240, batch_size=16, learning_rate=3e-3, warmup_fraction=0.05, max_predictions=16),
        finetune_data=dict(max_length=64, offline_train_examples=512, offline_dev_examples=256,
                           offline_test_examples=256, bible_books=tuple(range(1, 11)), bible_dev_fraction=0.1,
                           bible_test_fraction=0.1),
        finetune_train=dict(num_steps=60, batch_size=16, learning_rate=1e-3),
        analysis=dict(_TINY_ANALYSIS, probe_length=64, lengths=(16, 32, 64), probe_epochs=4),
        max_sentences=32, probe_examples=128, curve_points=4, analysis_points=2, eval_batches=4, length_tokens=4096,
        xla_flags=FAST_COMPILE),
    # For tests: a d = 32 model (D = 8) on 32-token rows, a few steps.
    "micro": Profile(
        "micro", "tests: a d = 32 model, a few steps", ("none", "tisa"), 2,
        model=dict(d_model=32, num_layers=2, num_heads=4, mlp_dim=48, max_length=32, dropout=0.0,
                   attention_dropout=0.0),
        data=dict(source="bible", bible_editions=("web",), max_documents=60, eval_fraction=0.2, seq_len=32,
                  vocab_size=400),
        train=dict(num_steps=12, batch_size=8, learning_rate=3e-3, warmup_fraction=0.1, max_predictions=8),
        finetune_data=dict(max_length=32, offline_train_examples=64, offline_dev_examples=32,
                           offline_test_examples=32, bible_books=(1, 2), bible_dev_fraction=0.1,
                           bible_test_fraction=0.1),
        finetune_train=dict(num_steps=4, batch_size=8, learning_rate=1e-3),
        analysis=dict(num_probe_words=4, probe_length=32, lengths=(8, 16), windows=1, probe_epochs=2,
                      probe_patience=1, probe_learning_rate=3e-3, decomposition_sentences=4),
        max_sentences=16, probe_examples=24, curve_points=2, analysis_points=2, eval_batches=2, timing_steps=3,
        length_tokens=1024,
        xla_flags=FAST_COMPILE),
}


def mechanism_of(profile: Profile, name: str) -> RunMechanism:
    """The run mechanism `name` of a profile: one of its variants, else the registry's."""
    if name in profile.variants:
        variant = profile.variants[name]
        return run_mechanism(name, variant["position"], variant.get("label"), variant.get("model"))
    return RUN_MECHANISMS[name]


def base_config(profile: Profile):
    """The profile's base config file (the repository's configs/..., or a path) with its overrides applied."""
    path = repo_config(profile.config) if profile.config.startswith("configs/") else profile.config
    return apply_overrides(load_config(path), list(profile.overrides))


def run_name(mechanism: str, seed: int) -> str:
    return f"{mechanism}_s{seed}"


def repo_config(relative: str) -> str:
    """The path of a config file of the repository (`relative` is configs/...): the copy an installed wheel ships
    as jaxpos/_configs (setup.py), else the file itself in the checkout that holds the package."""
    bundled = importlib.resources.files("jaxpos").joinpath("_configs", *relative.split("/")[1:])
    checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), relative)
    # The wheel's copy first: a source tree never holds jaxpos/_configs, while site-packages may hold others' configs/.
    for path in (str(bundled), checkout):
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{relative} is neither in the installed package ({bundled}) nor in a checkout "
                            f"({checkout}): reinstall jaxpos")


# --- the configs of a run ---------------------------------------------------------------------------------------

def clean_log_every(steps: int, every: int) -> int:
    """A logging interval whose last window, (steps - every + 1, steps], holds no checkpoint or evaluation (they
    happen at multiples of `every`), so its mean step time is the step's own cost (the step-time claim reads it)."""
    return steps - (every - 1) if every > 1 else steps


def pretrain_config(plan: dict, mechanism: str, seed: int):
    """configs/mlm/tiny.py with the profile's recipe, the mechanism's position block, the shared tokenizer, and a
    checkpoint (all kept) at each step of the learning curve and of the initialisation (step 0)."""
    profile = profile_of(plan)
    config = base_config(profile)
    run = mechanism_of(profile, mechanism)
    config.model.update(profile.model)
    config.model.update(run.model)
    for key, value in run.position.items():
        if isinstance(value, dict):
            config.model.position[key].update(value)
        else:
            config.model.position[key] = value
    config.data.update(profile.data)
    config.data.update(tokenizer_path=plan.get("tokenizer", ""), seed=seed)
    steps = profile.steps
    every = steps // profile.curve_points
    config.train.update(profile.train)
    config.train.update(seed=seed, log_every=clean_log_every(steps, every), eval_every=steps,
                        eval_batches=profile.eval_batches, checkpoint_every=every, checkpoint_initial=True,
                        keep_checkpoints=profile.curve_points + 2)
    return config


def finetune_config(plan: dict, seed: int, task: str = "paraphrase", learning_rate: float | None = None):
    """configs/finetune/paraphrase.py (the offline Bible paraphrase task) or, with task="order",
    configs/finetune/bible_order.py (the word-order pair task: its own data and steps, `order_inputs` and
    `order_recipe`) with the profile's recipe (at `learning_rate`, else the recipe's) and two dev evaluations
    (half-way and at the end; a run's score is the better one, as in DIET's protocol), each checkpointed (a run
    killed after half-way resumes from there)."""
    profile = profile_of(plan)
    config = load_config(repo_config("configs/finetune/bible_order.py" if task == "order" else
                                     "configs/finetune/paraphrase.py"))
    config.data.update(profile.order_inputs() if task == "order" else profile.finetune_data)
    config.data.seed = seed
    config.train.update(profile.order_recipe() if task == "order" else profile.finetune_train)
    if learning_rate is not None:
        config.train.learning_rate = learning_rate
    steps = config.train.num_steps
    every = max(1, steps // 2)
    config.train.update(seed=seed, eval_every=every, log_every=clean_log_every(steps, every), checkpoint_every=every)
    return config


# --- the plan ----------------------------------------------------------------------------------------------------

def make_plan(profile: Profile, seeds: int, needs: Mapping[str, Sequence[str]], workers: int,
              claims: Sequence[str] = ()) -> dict:
    """The run matrix: a run per mechanism of `needs` ({mechanism: stages}) and seed, doing those stages."""
    profile.check()
    if seeds < 1:
        raise ValueError(f"--seeds {seeds}: need at least one seed")
    if workers < 1:
        raise ValueError(f"--workers {workers}: need at least one")
    if not needs:
        raise ValueError("the chosen claims need no run of the chosen mechanisms")
    bad = sorted({s for stages in needs.values() for s in stages} - set(STAGES))
    if bad:
        raise ValueError(f"unknown stages {bad}; stages are {', '.join(STAGES)}")
    order = [m for m in [*RUN_MECHANISMS, *profile.variants] if m in needs]  # the registry's order, then variants
    order = list(dict.fromkeys(order))
    runs = {run_name(m, s): dict(mechanism=m, seed=s, stages=[x for x in STAGES if x in needs[m]])
            for s in range(seeds) for m in order}  # seed-major: every mechanism's first seed comes first
    return dict(profile=dataclasses.asdict(profile), mechanisms=order, claims=list(claims), seeds=seeds,
                workers=workers, runs=runs, machine=machine(), created=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                started_unix=time.time())


def load_plan(out: str) -> dict | None:
    """OUT/plan.json, its tokenizer's path made absolute; None where there is none."""
    path = os.path.join(out, PLAN_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        plan = json.load(f)
    if plan.get("tokenizer"):
        plan["tokenizer"] = os.path.join(os.path.abspath(out), plan["tokenizer"])
    return plan


def require_plan(out: str, then: str) -> dict:
    """`load_plan`, or a FileNotFoundError saying that OUT/plan.json is missing and `then`, what to do."""
    plan = load_plan(out)
    if plan is None:
        raise FileNotFoundError(f"{out}/{PLAN_FILE} is missing: {then}")
    return plan


def save_plan(out: str, plan: dict) -> None:
    """Writes OUT/plan.json, the tokenizer's path relative to OUT: the folder may move to another host and resume
    there (finished runs are reused)."""
    os.makedirs(out, exist_ok=True)
    saved = dict(plan)
    if saved.get("tokenizer"):
        saved["tokenizer"] = os.path.relpath(saved["tokenizer"], os.path.abspath(out))
    write_json_atomically(os.path.join(out, PLAN_FILE), saved, indent=1)


def resumed_line(plan: dict) -> list[str]:
    """A line saying that the wall time is the last command's alone when the plan was resumed (one estimate is
    kept per command that ran runs), with the time since the plan was made."""
    commands = len(plan.get("estimates") or [])
    if commands < 2:
        return []
    since = (time.time() - plan["started_unix"]) / 60
    return [f"- resumed: the times above are the last of {commands} commands (a run's time counts only what that "
            f"command ran); the plan was made at {plan['created']}, {since:.0f} min before this report"]


def profile_of(plan: dict) -> Profile:
    """The plan's profile (as saved: tuples came back as lists)."""
    values = dict(plan["profile"])
    values["mechanisms"] = tuple(values["mechanisms"])
    if "lengths" in values["analysis"]:
        values["analysis"] = dict(values["analysis"], lengths=tuple(values["analysis"]["lengths"]))
    for key in ("length_factors", "order_learning_rates", "overrides"):
        if key in values:
            values[key] = tuple(values[key])
    return Profile(**values)


def run_dir(out: str, name: str) -> str:
    return os.path.join(out, "runs", name)


def pretrain_dir(out: str, name: str) -> str:
    """Where run NAME pretrains: a `jaxpos train` workdir."""
    return os.path.join(run_dir(out, name), "pretrain")


def pretraining_groups(plan: dict) -> dict[str, list[str]]:
    """{mechanism: the names of its runs, by seed}: the runs whose pretraining is one program (their seeds at
    once), in the plan's order. A group is named by its mechanism, a run by its mechanism and seed."""
    groups: dict[str, list[str]] = {}
    for name, spec in plan["runs"].items():
        groups.setdefault(spec["mechanism"], []).append(name)
    return groups


def unfinished_groups(out: str, plan: dict) -> dict[str, tuple[list[str], list[str]]]:
    """{mechanism: (its runs without a result, those of them that have not finished pretraining)} of the
    mechanisms with unfinished runs. Where more than one run is left to pretrain, they pretrain at once; a run
    left alone pretrains with its other stages."""
    steps = profile_of(plan).steps
    groups = {}
    for mechanism, names in pretraining_groups(plan).items():
        pending = [n for n in names if read_result(out, n) is None]
        if pending:
            groups[mechanism] = (pending, [n for n in pending if not pretraining_finished(out, n, steps)])
    return groups


def group_log(out: str, mechanism: str) -> str:
    """The log of a mechanism's pretraining (its seeds at once)."""
    return os.path.join(out, "runs", f"{mechanism}.pretraining.log")


def pretraining_finished(out: str, name: str, steps: int) -> bool:
    """Whether run NAME has pretrained all `steps` (its report.json, written when the loop ends, says so)."""
    path = os.path.join(pretrain_dir(out, name), "report.json")
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        return json.load(f).get("step") == steps


def read_result(out: str, name: str) -> dict | None:
    path = os.path.join(run_dir(out, name), RESULT_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def mark_failed(out: str, name: str, message: str) -> None:
    with open(os.path.join(run_dir(out, name), FAILED_FILE), "w") as f:
        f.write(message.strip() + "\n")


def failure(out: str, name: str) -> str | None:
    path = os.path.join(run_dir(out, name), FAILED_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read().strip()
