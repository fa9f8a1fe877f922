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

import ml_collections

from jaxpos.config.checks import unknown_field
from jaxpos.config.defaults import model_block
from jaxpos.config.files import apply_overrides, load_config, write_json_atomically
from jaxpos.config.model import ModelConfig
from jaxpos.config.position import PositionConfig
from jaxpos.config.run import FinetuneDataConfig, MLMDataConfig, TrainConfig
from jaxpos.positions import MECHANISMS, import_mechanisms, mechanism as registered
from jaxpos.positions.registry import IMPORT_VARIABLE, read_entry_points
from jaxpos.reproduction.host import machine
from jaxpos.reproduction.profiles import EVERY_MECHANISM

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
    """A mechanism as the reproduction runs it: a label and the `--config.*` overrides that make it from any masked-LM
    recipe (its kind, its options, the model fields it sets), checked through the run config when a plan is
    made."""

    name: str
    label: str  # as the report names it
    overrides: tuple[str, ...]  # --config.model.position.kind=KIND and the rest
    learned: bool  # has learned positional parameters (Chen's "learned encodings")

    @property
    def kind(self) -> str:
        return next(o.partition("=")[2] for o in self.overrides if o.startswith("--config.model.position.kind="))


def kind_override(kind: str) -> str:
    return f"--config.model.position.kind={kind}"


def run_mechanism(name: str, overrides: Sequence[str], label: str | None = None) -> RunMechanism:
    """The run `name` of `overrides` (the first sets the kind); `learned` from the registry under the options the
    overrides set, and its label unless given."""
    overrides = tuple(overrides)
    if not overrides or not overrides[0].startswith("--config.model.position.kind="):
        raise ValueError(f"run {name!r}: its overrides start with {kind_override('KIND')}, got {overrides}")
    block = apply_overrides(ml_collections.ConfigDict(dict(model=model_block())), list(overrides))
    position = PositionConfig.from_values(block.model.position)
    record = registered(position.kind)
    return RunMechanism(name, label or record.label, overrides, record.is_learned(position.options))


# The runs of a kind beside its own (named after the kind, with the registry's label and default options):
# (name, label, overrides of the kind's options and the model).
RUN_VARIANTS = {
    "tisa": [("tisa_input", "TISA + input positions", ["--config.model.position.tisa.input_positions=True"])],
    "diet_rel": [("diet_rel_layer", "DIET-Rel, shared by layer", ["--config.model.position.diet_rel.sharing=layer"])],
    "diet_abs": [("diet_abs_unshared", "DIET-Abs, unshared", ["--config.model.position.diet_abs.sharing=none"]),
                 ("diet_abs_segments", "DIET-Abs, shared by layer, per-head segments",
                  ["--config.model.position.diet_abs.sharing=layer", "--config.model.position.segment=per_head"])],
    "attenuated": [("attenuated_learned", "attenuated, learnable (n x n per head)",
                    ["--config.model.position.attenuated.form=matrix"])],
}


def registry_runs() -> dict[str, RunMechanism]:
    """Every registered mechanism, each followed by its variants (a mechanism registered later, a researcher's,
    included)."""
    read_entry_points()  # an installed package's mechanisms and those --import named, before the list is read
    return {run.name: run for kind in list(MECHANISMS) for run in (
        run_mechanism(kind, [kind_override(kind)]),
        *(run_mechanism(name, [kind_override(kind), *options], label)
          for name, label, options in RUN_VARIANTS.get(kind, ())))}


RUN_MECHANISMS = registry_runs()
BAG_OF_WORDS = "none"  # the baseline every learning curve is judged against
TIMING_MECHANISM = "tisa"  # timed for the estimate: a logit-bias mechanism, its step costs what most runs' do



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
    # Mechanisms of this profile beyond the registry's runs: {name: {"label", "overrides", "eval"}}, where
    # "overrides" make it from the recipe (the first sets its kind) and "eval" holds {row: overrides} of options
    # applied at evaluation only (RoPE's length rules: `jaxpos compare`).
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


PROFILE_NAMES = ("full", "smoke", "micro")  # the profile files of configs/reproduce/


def load_profile(spec: str) -> Profile:
    """A profile by name (configs/reproduce/NAME.py of the repository, or of an installed wheel) or a profile file's
    path (`path.py`, `get_config()` returning a Profile's fields): a recipe is a config file like any other."""
    path = repo_config(f"configs/reproduce/{spec}.py") if spec in PROFILE_NAMES else spec
    if not spec.endswith(".py") and spec not in PROFILE_NAMES:
        raise ValueError(f"unknown profile {spec!r}; choose one of {', '.join(PROFILE_NAMES)} or give a profile file "
                         "(configs/reproduce/*.py shows the fields)")
    values = load_config(path).to_dict()
    if values.get("mechanisms") == EVERY_MECHANISM:
        values["mechanisms"] = tuple(RUN_MECHANISMS)
    return profile_from(values)


def profile_from(values: Mapping) -> Profile:
    """A Profile from its fields as a file or a saved plan holds them (tuples come back as lists)."""
    values = dict(values)
    values["mechanisms"] = tuple(values["mechanisms"])
    if "lengths" in values.get("analysis", {}):
        values["analysis"] = dict(values["analysis"], lengths=tuple(values["analysis"]["lengths"]))
    for key in ("length_factors", "order_learning_rates", "overrides"):
        if key in values:
            values[key] = tuple(values[key])
    for key in ("data", "finetune_data", "order_data"):  # fields whose typed defaults are tuples
        if values.get(key):
            values[key] = {k: tuple(v) if isinstance(v, list) else v for k, v in values[key].items()}
    return Profile(**values)


class _Profiles(Mapping):
    """The named profiles, each read from its file when first asked for."""

    def __init__(self):
        self._loaded: dict[str, Profile] = {}

    def __getitem__(self, name: str) -> Profile:
        if name not in PROFILE_NAMES:
            raise KeyError(name)
        if name not in self._loaded:
            self._loaded[name] = load_profile(name)
        return self._loaded[name]

    def __iter__(self):
        return iter(PROFILE_NAMES)

    def __len__(self) -> int:
        return len(PROFILE_NAMES)


PROFILES = _Profiles()


def mechanism_of(profile: Profile, name: str) -> RunMechanism:
    """The run mechanism `name` of a profile: one of its variants, else the registry's."""
    if name in profile.variants:
        variant = profile.variants[name]
        return run_mechanism(name, variant_overrides(variant), variant.get("label"))
    runs = RUN_MECHANISMS if name in RUN_MECHANISMS else registry_runs()  # a mechanism registered since import
    if name not in runs:
        raise ValueError(f"unknown mechanism {name!r}; choose from {', '.join(runs)} (a mechanism of your own: "
                         "--import MODULE)")
    return runs[name]


def variant_overrides(variant: dict) -> list[str]:
    """A variant's overrides; a plan saved before variants were overrides gives its position and model blocks."""
    if "overrides" in variant:
        return list(variant["overrides"])
    position = dict(variant["position"])
    out = [kind_override(position.pop("kind"))]
    for key, value in position.items():
        if isinstance(value, dict):
            out += [f"--config.model.position.{key}.{k}={v}" for k, v in value.items()]
        else:
            out.append(f"--config.model.position.{key}={value}")
    return out + [f"--config.model.{k}={v}" for k, v in (variant.get("model") or {}).items()]


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
    config = apply_overrides(config, list(run.overrides))
    config.data.update(profile.data)
    config.data.update(tokenizer_path=plan.get("tokenizer", ""), seed=seed)
    steps = profile.steps
    every = steps // profile.curve_points
    config.train.update(profile.train)
    config.train.update(seed=seed, log_every=clean_log_every(steps, every), eval_every=steps,
                        eval_batches=profile.eval_batches, checkpoint_every=every, checkpoint_initial=True,
                        keep_checkpoints=profile.curve_points + 2)
    return config


EXTENSION_SHARE = 4  # an extension variant continues pretraining for 1/4 of the recipe's steps at its length


def extension_config(plan: dict, mechanism: str, seed: int, pretrained: str):
    """The continued pretraining of an extension variant's run (`extend` in its variant: context extension, as
    ModernBERT's): its pretraining config at `factor` times the training length with the extension's own options,
    from the newest parameters of the run pretrained in `pretrained` (train.init_from), for 1/EXTENSION_SHARE of the
    recipe's steps; None for any other variant."""
    profile = profile_of(plan)
    extend = profile.variants.get(mechanism, {}).get("extend")
    if not extend:
        return None
    config = pretrain_config(plan, mechanism, seed)
    length = int(extend["factor"]) * int(config.data.seq_len)
    config = apply_overrides(config, [f"--config.data.seq_len={length}",
                                      f"--config.model.max_length={max(int(config.model.max_length), length)}",
                                      *extend["overrides"]])
    steps = max(1, profile.steps // EXTENSION_SHARE)
    config.train.update(num_steps=steps, init_from=pretrained, eval_every=steps, checkpoint_every=steps,
                        checkpoint_initial=False, keep_checkpoints=2, log_every=clean_log_every(steps, steps))
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
    plan = dict(profile=dataclasses.asdict(profile), mechanisms=order, claims=list(claims), seeds=seeds,
                workers=workers, runs=runs, machine=machine(), created=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                started_unix=time.time(), imports=imported_modules())
    check_variants(plan)
    return plan


def imported_modules() -> list[str]:
    """The modules `--import` named in this command (researchers' mechanisms), which the plan's runs import."""
    return [m for m in os.environ.get(IMPORT_VARIABLE, "").split(",") if m]


def check_variants(plan: dict) -> None:
    """Every variant of a plan made into its run config and checked as its run would check it (the recipe, the
    tagged union of its position block, the model, the attention implementation on this host), and every rule at
    evaluation against its trained model: whatever a run would refuse is refused now, in one line naming the
    variant."""
    from jaxpos.training.validate import check_run_config  # lazy: loads jax; the plan's grammar needs none
    from jaxpos.workflows.lengths import evaluated_position  # lazy: with the check, as its run would read it

    profile = profile_of(plan)
    for name in plan["mechanisms"]:
        try:
            run = check_run_config(pretrain_config(plan, name, 0), task="mlm")
            for row, overrides in profile.variants.get(name, {}).get("eval", {}).items():
                run.replace_model(position=evaluated_position(run.model.position, overrides, f"{row}: a"))
            extension = extension_config(plan, name, 0, "")
            if extension is not None:
                check_extension(run, check_run_config(extension, task="mlm"))
        except ValueError as error:
            raise ValueError(f"variant {name!r}: {error}") from None


def check_extension(base, extended) -> None:
    """Refuses an extension whose model's parameters cannot carry over from the base run's: a learned position table
    shorter than the extension's rows (the registry's `inductive` trait), another mechanism."""
    kind = base.model.position.kind
    if extended.model.position.kind != kind:
        raise ValueError(f"extend: continued pretraining keeps the mechanism ({kind!r})")
    length = extended.data.seq_len
    if length > base.model.position_range and not registered(kind).is_inductive(base.model.position.options):
        raise ValueError(f"extend: {registered(kind).label} has learned positions for {base.model.position_range} "
                         f"tokens only; rows of {length} cannot start from them")


def load_plan(out: str) -> dict | None:
    """OUT/plan.json, its tokenizer's path made absolute; None where there is none."""
    path = os.path.join(out, PLAN_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        plan = json.load(f)
    if plan.get("imports"):  # the researchers' mechanisms its runs use, registered as the planning command had them
        import_mechanisms(plan["imports"])
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
    """A line saying that the wall time sums every command that ran the plan when it was resumed, with the time
    since the plan was made."""
    commands = len(plan.get("commands") or [])
    if commands < 2:
        return []
    since = (time.time() - plan["started_unix"]) / 60
    return [f"- resumed: the wall time is the sum over the {commands} commands that ran this plan (each counts what "
            f"it ran); the plan was made at {plan['created']}, {since:.0f} min before this report"]


def profile_of(plan: dict) -> Profile:
    """The plan's profile (as saved: tuples came back as lists)."""
    return profile_from(plan["profile"])


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


def trained_to(workdir: str) -> int | None:
    """The step a training workdir's report.json (written when its loop ends) records; None without one."""
    path = os.path.join(workdir, "report.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f).get("step")


def pretraining_finished(out: str, name: str, steps: int) -> bool:
    """Whether run NAME has pretrained all `steps` (its report.json says so)."""
    return trained_to(pretrain_dir(out, name)) == steps


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
