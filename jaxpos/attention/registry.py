"""The attention implementations by `model.attention_impl`: one record each, holding what it can compute (the kinds
of terms it takes and the facts of a call it handles), where, how fast it was measured, and its function.

Everything that picks or checks an implementation reads `IMPLEMENTATIONS`: the run's check (`check_attention`,
an explicit choice that cannot run this model's attention is refused in one line), `attention_impl="auto"`
(`jaxpos.attention.auto`: the fastest measured record that can take a call), the fallbacks of an explicit choice
for the calls it cannot take (decoding with a cache, a CPU mesh under the Hopper interpreter) and every error
message. One function, `lacks`, turns a record and the facts of a call (`Call`) into what the record lacks. A new
implementation is a record registered with `register_implementation`; the built-in ones are in
jaxpos/attention/core.py.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import jax

from jaxpos.attention.terms import TERM_KINDS
from jaxpos.config.model import register_model_check

AUTO = "auto"
BIAS_FORMS = ("none", "table", "factors", "other")  # the measured cases of `Implementation.step_ms`: `Call.form`
LOW_PRECISION = ("bfloat16", "float16")
EVERY_KIND = "*"  # an implementation that takes every kind of term (the XLA reference)


@dataclasses.dataclass(frozen=True)
class Call:
    """The facts of an attention call (or, at a run's check, of every call a model makes) that decide which
    implementation can compute it."""

    platform: str = "cpu"  # jax.default_backend(): cpu | gpu | tpu
    gpu_capability: str = ""  # the GPUs' compute capability ("9.0": Hopper), the oldest where they differ
    low_precision: bool = False  # bf16 or f16 inputs
    terms: frozenset[str] = frozenset()  # the kinds of the call's positional terms (jaxpos.attention.terms)
    dropout: bool = False  # attention dropout in this call
    switches: bool = False  # the content_only / position_only ablations
    per_example_positions: bool = False  # positions per example (packed cross-attention)
    cached_causal: bool = False  # causal with T != S (decoding with a cache)
    window: bool = False  # a local layer's window of keys around each query (AttentionMask.window)
    odd_length: bool = False  # an odd T or S
    cpu_mesh_devices: int = 1  # CPU devices in the mesh the call runs under

    @property
    def hopper(self) -> bool:
        return self.gpu_capability.startswith("9")

    @property
    def form(self) -> str:
        """The measured case the terms make (BIAS_FORMS): "none" (RoPE's rotation at most), "table" (a Toeplitz
        table, with factors or segments beside it), "factors" (low-rank factors or per-head segments), else
        "other"."""
        kinds = set(self.terms) - {"rotary"}
        if not kinds:
            return "none"
        if "table" in kinds and kinds <= {"table", "factors", "segment"}:
            return "table"
        if kinds <= {"factors", "segment"}:
            return "factors"
        return "other"


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One attention implementation: what it computes (the term kinds and `Call` facts it takes), where, and how
    fast."""

    name: str  # the value of model.attention_impl
    function: Callable  # with `attend`'s arguments -> (out, weights or None, logits or None)
    summary: str  # what it is, in one line
    platforms: tuple[str, ...]  # jax backends it runs on (the CPU: the Pallas interpreter for the kernels)
    terms: frozenset[str]  # the kinds of terms it takes (EVERY_KIND: all)
    dropout: bool = False
    switches: bool = False
    per_example_positions: bool = False
    cached_causal: bool = False
    window: bool = False
    hopper_only: bool = False  # on GPUs: wgmma and TMA
    low_precision_only: bool = False  # bf16 / f16 inputs only
    even_lengths: bool = False  # trains with a bias or mask at even lengths only (cuDNN): auto and the fallbacks
    # give it no odd length; named explicitly it takes any (inference at odd lengths works)
    one_cpu_device: bool = False  # its CPU interpreter runs one device at a time
    fallbacks: tuple[str, ...] = ()  # where an explicit choice sends a call it cannot take, first that can
    # Fastest of 20 BERT-base masked-LM steps (ms), 32 x 512, bf16 compute, one NVIDIA H200, jax 0.11.2,
    # 2026-11-26 (bench/RESULTS.md, "MLM step per path"), by (bias form, attention dropout).
    step_ms: Mapping[tuple[str, bool], float] = dataclasses.field(default_factory=dict)
    tie_rank: int = 99  # within auto's margin the lower rank keeps a call (a vendor kernel compiles in seconds)

    def takes(self, kind: str) -> bool:
        return EVERY_KIND in self.terms or kind in self.terms


IMPLEMENTATIONS: dict[str, Implementation] = {}


def register_implementation(implementation: Implementation) -> Implementation:
    """Adds an implementation under its name (a registered name is replaced)."""
    IMPLEMENTATIONS[implementation.name] = implementation
    return implementation


def attention_impls() -> tuple[str, ...]:
    """What `model.attention_impl` accepts: "auto" and every registered implementation."""
    return (AUTO, *IMPLEMENTATIONS)


def term_description(kind: str) -> str:
    term = TERM_KINDS.get(kind)
    return term.description if term is not None and term.description else f"a term of kind {kind!r}"


def lacks(impl: Implementation, call: Call) -> str | None:
    """What `impl` lacks to compute `call`, in words (None: it can). One check per feature, each reading the
    record."""
    if call.platform not in impl.platforms:
        return f"the {call.platform} backend"
    if impl.hopper_only and call.platform == "gpu" and not call.hopper:
        return f"a GPU of compute capability {call.gpu_capability or 'unknown'} (wgmma needs Hopper, 9.0)"
    if impl.one_cpu_device and call.platform == "cpu" and call.cpu_mesh_devices > 1:
        return (f"a mesh of {call.cpu_mesh_devices} CPU devices (the interpreter cannot run kernels on several "
                "devices at once)")
    if impl.low_precision_only and not call.low_precision:
        return "float32 inputs (bf16 or f16 only)"
    for kind in sorted(call.terms):
        if not impl.takes(kind):
            return term_description(kind)
    for needed, present, what in (
            (call.switches, impl.switches, "the content_only/position_only switches"),
            (call.dropout, impl.dropout, "attention dropout"),
            (call.per_example_positions, impl.per_example_positions, "per-example positions (packed cross-attention)"),
            (call.cached_causal, impl.cached_causal, "causal attention with T != S (decoding with a cache)"),
            (call.window, impl.window, "a local attention window")):
        if needed and not present:
            return what
    return None


def suits(impl: Implementation, call: Call) -> bool:
    """Whether an automatic choice (`auto`, a fallback) may give `impl` the call: it can compute it, and it can
    also train it (cuDNN trains with a bias or mask at even lengths only; a call named explicitly may still go to
    it, e.g. decoding at odd lengths)."""
    return lacks(impl, call) is None and not (impl.even_lengths and call.odd_length)


def can_take(call: Call) -> list[str]:
    """The implementations an automatic choice may give `call` (`suits`), in registry order."""
    return [name for name, impl in IMPLEMENTATIONS.items() if suits(impl, call)]


def platform_facts() -> dict:
    """`Call`'s platform facts of this process: the backend, the GPUs' compute capability (the oldest), and the
    CPU devices of the abstract mesh in use (1 outside a mesh)."""
    platform = jax.default_backend()
    capability = ""
    if platform == "gpu":
        capability = min((str(getattr(d, "compute_capability", "")) for d in jax.devices()),
                         key=lambda c: tuple(int(x) for x in c.split(".") if x.isdigit()) or (0,))
    mesh = jax.sharding.get_abstract_mesh()
    devices = 1 if platform != "cpu" or mesh.empty else mesh.size
    return dict(platform=platform, gpu_capability=capability, cpu_mesh_devices=devices)


def model_call(cfg, terms: frozenset[str], *, training: bool, **platform) -> Call:
    """The facts every attention call of the model `cfg` (a ModelConfig) shares, with `terms` the kinds of terms
    its layers receive (jaxpos.models.attention_terms); `platform`: `platform_facts()` (default) or given.
    Per-call facts (a decoding cache, packed cross-attention, the mesh) are left out: they decide fallbacks, not
    whether the choice can run at all."""
    pcfg = cfg.position
    return Call(**(platform or platform_facts()), low_precision=cfg.dtype in LOW_PRECISION, terms=frozenset(terms),
                dropout=training and cfg.attention_dropout > 0.0,
                switches=bool(pcfg.content_only or pcfg.position_only),
                window=cfg.has_local_layers)  # the local layers' calls


def names(wanted: list[str]) -> str:
    """'a', 'b' or 'c'."""
    quoted = [repr(n) for n in wanted]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def check_attention(cfg, terms: frozenset[str], *, training: bool, **platform) -> None:
    """Raises a ValueError, in one line naming what it lacks, when `cfg.attention_impl` names an implementation
    that cannot compute the model's attention here (`terms`: the kinds its layers receive; `training`: with its
    attention dropout)."""
    if cfg.attention_impl == AUTO:
        return
    impl = IMPLEMENTATIONS[cfg.attention_impl]
    call = model_call(cfg, terms, training=training, **platform)
    if call.dropout and not impl.dropout:  # the message configs have always given
        able = [AUTO, *(n for n, i in IMPLEMENTATIONS.items() if i.dropout)]
        raise ValueError(f"attention dropout needs attention_impl={names(able)}, not {impl.name!r}; or set "
                         "model.attention_dropout=0")
    missing = lacks(impl, call)
    if missing is not None:
        raise ValueError(f"attention_impl={impl.name!r} cannot compute this model's attention here: it lacks "
                         f"{missing}; use attention_impl={names(can_take(call))} (or 'auto')")


@register_model_check
def _known_implementation(cfg) -> None:
    if cfg.attention_impl not in attention_impls():
        raise ValueError(f"attention_impl={cfg.attention_impl!r}; choose {', '.join(attention_impls())}")
