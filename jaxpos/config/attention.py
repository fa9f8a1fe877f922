"""The attention implementations by `model.attention_impl`: one record each, holding what it can compute, where,
how fast it was measured, and the function that computes it.

Everything that picks or checks an implementation reads `IMPLEMENTATIONS`: config validation (`check_attention`,
an explicit choice that cannot run this model's attention is refused in one line), `attention_impl="auto"`
(`jaxpos.attention.auto`: the fastest measured record that can take a call), the fallbacks of an explicit choice
for the calls it cannot take (decoding with a cache, a CPU mesh under the Hopper interpreter) and every error
message. One function, `lacks`, turns a record and the facts of a call (`Call`) into what the record lacks. It
lives in the config layer, the lowest, so that configs are checked against it; each record names its function by
import path, imported where attention runs. A new implementation is a record here and its function.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Mapping

import jax

from jaxpos.config.mechanisms import MECHANISMS

AUTO = "auto"
BIAS_FORMS = ("none", "table", "factors", "other")  # what reaches attention: see `Call.form`
LOW_PRECISION = ("bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class Call:
    """The facts of an attention call (or, at config validation, of every call a model makes) that decide which
    implementation can compute it."""

    platform: str = "cpu"  # jax.default_backend(): cpu | gpu | tpu
    gpu_capability: str = ""  # the GPUs' compute capability ("9.0": Hopper), the oldest where they differ
    low_precision: bool = False  # bf16 or f16 inputs
    # "none": no positional logits; "table": a Toeplitz table over offsets; "factors": low-rank factors or per-head
    # segment tables, folded into q and k; "other": a dense [T, S] matrix, Shaw vectors or Linformer projections.
    form: str = "none"
    dropout: bool = False  # attention dropout in this call
    shaw: bool = False  # Shaw's query-dependent relative vectors
    contextual: bool = False  # CoPE: positions counted from the gated logits, inside the logits path
    disentangled: bool = False  # DeBERTa's c2p and p2c terms (products of q and k with relative embeddings)
    switches: bool = False  # the content_only / position_only ablations
    per_example_positions: bool = False  # positions per example (packed cross-attention)
    linformer: bool = False  # Linformer key projections
    cached_causal: bool = False  # causal with T != S (decoding with a cache)
    window: bool = False  # a local layer's window of keys around each query (AttentionMask.window)
    odd_length: bool = False  # an odd T or S
    cpu_mesh_devices: int = 1  # CPU devices in the mesh the call runs under

    @property
    def hopper(self) -> bool:
        return self.gpu_capability.startswith("9")


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One attention implementation: what it computes (the `Call` facts it takes), where, and how fast."""

    name: str  # the value of model.attention_impl
    function: str  # "package.module:function" with `attend`'s arguments, -> (out, weights or None)
    summary: str  # what it is, in one line
    platforms: tuple[str, ...]  # jax backends it runs on (the CPU: the Pallas interpreter for the kernels)
    forms: tuple[str, ...]  # the bias forms it computes
    dropout: bool = False
    shaw: bool = False
    contextual: bool = False
    disentangled: bool = False
    switches: bool = False
    per_example_positions: bool = False
    linformer: bool = False
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

    def run(self) -> Callable:
        """The function that computes attention on this path (imported on first use)."""
        module, _, name = self.function.partition(":")
        return getattr(importlib.import_module(module), name)


IMPLEMENTATIONS: dict[str, Implementation] = {i.name: i for i in (
    Implementation("xla", "jaxpos.attention.core:reference_attention",
                   "einsum and softmax: every term exact, the attention weights kept for the analyses",
                   platforms=("cpu", "gpu", "tpu"), forms=BIAS_FORMS, dropout=True, shaw=True, contextual=True,
                   disentangled=True, switches=True, per_example_positions=True, linformer=True, cached_causal=True,
                   window=True, step_ms={("none", True): 45.6, ("table", True): 54.7, ("factors", True): 49.1},
                   tie_rank=1),
    Implementation("jax", "jaxpos.attention.core:dot_product_attention",
                   "jax.nn.dot_product_attention, XLA's choice of kernel; position-only terms materialised once",
                   platforms=("cpu", "gpu", "tpu"), forms=BIAS_FORMS, per_example_positions=True, linformer=True,
                   cached_causal=True, window=True, tie_rank=4),
    Implementation("cudnn", "jaxpos.attention.core:dot_product_attention",
                   "jax.nn.dot_product_attention on cuDNN's fused kernel; position-only terms materialised once",
                   platforms=("gpu",), forms=BIAS_FORMS, per_example_positions=True, linformer=True,
                   cached_causal=True, window=True, low_precision_only=True, even_lengths=True,
                   step_ms={("none", False): 35.5, ("table", False): 39.2, ("factors", False): 41.9}, tie_rank=0),
    Implementation("pallas", "jaxpos.attention.core:toeplitz_kernel_attention",
                   "the Toeplitz kernel in Pallas (Triton on GPUs, Mosaic on TPUs), the table read inside it",
                   platforms=("cpu", "gpu", "tpu"), forms=("none", "table", "factors"), dropout=True, window=True,
                   fallbacks=("cudnn", "xla"), tie_rank=3),
    Implementation("mosaic_gpu", "jaxpos.attention.core:toeplitz_kernel_attention",
                   "the Toeplitz kernel for Hopper GPUs (wgmma, TMA), the table read inside it",
                   platforms=("cpu", "gpu"), forms=("none", "table", "factors"), dropout=True, window=True,
                   hopper_only=True, low_precision_only=True, one_cpu_device=True, fallbacks=("pallas", "cudnn", "xla"),
                   step_ms={("none", False): 34.2, ("table", False): 38.2, ("factors", False): 37.4,
                            ("none", True): 38.6, ("table", True): 41.5, ("factors", True): 40.0}, tie_rank=2),
)}
ATTENTION_IMPLS = (AUTO, *IMPLEMENTATIONS)


def lacks(impl: Implementation, call: Call) -> str | None:
    """What `impl` lacks to compute `call`, in words (None: it can). One check per feature, each reading the
    record."""
    if call.form not in BIAS_FORMS:
        raise ValueError(f"bias form {call.form!r}; choose {', '.join(BIAS_FORMS)}")
    if call.platform not in impl.platforms:
        return f"the {call.platform} backend"
    if impl.hopper_only and call.platform == "gpu" and not call.hopper:
        return f"a GPU of compute capability {call.gpu_capability or 'unknown'} (wgmma needs Hopper, 9.0)"
    if impl.one_cpu_device and call.platform == "cpu" and call.cpu_mesh_devices > 1:
        return (f"a mesh of {call.cpu_mesh_devices} CPU devices (the interpreter cannot run kernels on several "
                "devices at once)")
    if impl.low_precision_only and not call.low_precision:
        return "float32 inputs (bf16 or f16 only)"
    for needed, present, what in (
            (call.shaw, impl.shaw, "Shaw's relative vectors"),
            (call.contextual, impl.contextual, "CoPE's contextual positions (counts of gates over the logits)"),
            (call.disentangled, impl.disentangled, "DeBERTa's disentangled relative terms (c2p, p2c)"),
            (call.switches, impl.switches, "the content_only/position_only switches"),
            (call.dropout, impl.dropout, "attention dropout"),
            (call.per_example_positions, impl.per_example_positions, "per-example positions (packed cross-attention)"),
            (call.linformer, impl.linformer, "Linformer key projections"),
            (call.cached_causal, impl.cached_causal, "causal attention with T != S (decoding with a cache)"),
            (call.window, impl.window, "a local attention window")):
        if needed and not present:
            return what
    if call.form not in impl.forms:
        return "a positional term other than a Toeplitz table or low-rank factors (a dense matrix)"
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


def model_call(cfg, *, training: bool, **platform) -> Call:
    """The facts every attention call of the model `cfg` (a ModelConfig) shares, as its config decides them;
    `platform`: `platform_facts()` (default) or given. Per-call facts (a decoding cache, packed cross-attention,
    the mesh) are left out: they decide fallbacks, not whether the choice can run at all."""
    pcfg = cfg.position
    causal = cfg.causal or cfg.num_decoder_layers > 0  # a causal stack, where the mechanism's form may differ
    form = MECHANISMS[pcfg.kind].kernel_form_for(pcfg, causal) or "other"
    if pcfg.segment == "per_head" and form == "none":
        form = "factors"  # per-head segment tables reach the kernels as folded factors
    if pcfg.randomized_max_length and form == "table":
        form = "other"  # at scattered positions a Toeplitz table is read once per pass into a dense matrix
    return Call(**(platform or platform_facts()), low_precision=cfg.dtype in LOW_PRECISION, form=form,
                dropout=training and cfg.attention_dropout > 0.0, shaw=pcfg.kind == "shaw",
                contextual=pcfg.kind == "cope" and not pcfg.content_only,
                disentangled=pcfg.kind == "deberta",
                switches=bool(pcfg.content_only or pcfg.position_only),
                linformer=pcfg.kind == "diet_abs" and bool(pcfg.diet_abs.linformer_k),
                window=cfg.local_window is not None)  # the local layers' calls


def names(wanted: list[str]) -> str:
    """'a', 'b' or 'c'."""
    quoted = [repr(n) for n in wanted]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def check_attention(cfg, *, training: bool, **platform) -> None:
    """Raises a ValueError, in one line naming what it lacks, when `cfg.attention_impl` names an implementation
    that cannot compute the model's attention here (`training`: with its attention dropout)."""
    if cfg.attention_impl == AUTO:
        return
    impl = IMPLEMENTATIONS[cfg.attention_impl]
    call = model_call(cfg, training=training, **platform)
    if call.dropout and not impl.dropout:  # the message configs have always given
        able = [AUTO, *(n for n, i in IMPLEMENTATIONS.items() if i.dropout)]
        raise ValueError(f"attention dropout needs attention_impl={names(able)}, not {impl.name!r}; or set "
                         "model.attention_dropout=0")
    missing = lacks(impl, call)
    if missing is not None:
        raise ValueError(f"attention_impl={impl.name!r} cannot compute this model's attention here: it lacks "
                         f"{missing}; use attention_impl={names(can_take(call))} (or 'auto')")
