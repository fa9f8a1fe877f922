"""attention_impl="auto": for each attention call, the fastest measured implementation that can run it.

The choice reads the records of jaxpos.config.attention.IMPLEMENTATIONS: which can take the call (`lacks`) and
their measured BERT-base masked-LM step times per bias form and attention dropout (`step_ms`, bench/RESULTS.md,
"MLM step per path"). A path counts as faster only by more than `MARGIN`, else the one of lower `tie_rank` keeps
the call. Where nothing was measured (CPU, TPU, float32 on a GPU) the call takes the XLA reference. Pure: `attend`
gathers the facts of a call and logs the choice once.
"""

from __future__ import annotations

from jaxpos.config.attention import BIAS_FORMS, IMPLEMENTATIONS, Call, can_take

# The records' step times by case: {(form, dropout): {path: ms}} (tests check them against bench/RESULTS.md).
STEP_MS = {}
for _impl in IMPLEMENTATIONS.values():
    for _case, _ms in _impl.step_ms.items():
        STEP_MS.setdefault(_case, {})[_impl.name] = _ms
# Three times the spread of the baseline measured twice in that run (35.5 and 36.0 ms: 1.4%).
MARGIN = 0.05
# On a tie, the lower tie_rank: cuDNN (a vendor kernel, compiled in seconds), the XLA reference, then the Hopper
# kernels (about 100 s more compilation per program).
PREFERENCE = tuple(sorted(IMPLEMENTATIONS, key=lambda name: IMPLEMENTATIONS[name].tie_rank))

__all__ = ["BIAS_FORMS", "MARGIN", "PREFERENCE", "STEP_MS", "choose", "choose_for", "fastest_measured"]


def fastest_measured(form: str, dropout: bool, runnable: set[str]) -> tuple[str, str] | None:
    """(path, why) from `STEP_MS` among `runnable` paths, or None when none of them was measured for the case."""
    measured = {path: ms for path, ms in STEP_MS.get((form, dropout), {}).items() if path in runnable}
    if not measured:
        return None
    best = min(measured.values())
    path = next(p for p in PREFERENCE if p in measured and measured[p] <= best * (1 + MARGIN))
    others = ", ".join(f"{p} {ms:g}" for p, ms in sorted(measured.items(), key=lambda kv: kv[1]) if p != path)
    case = f"{form} bias, {'with' if dropout else 'no'} attention dropout"
    return path, f"{case}: {path} {measured[path]:g} ms a BERT-base step on an H200" + (
        f" (beside {others})" if others else "")


def choose_for(call: Call, exclude: frozenset[str] = frozenset()) -> tuple[str, str]:
    """(attention_impl, one-line reason) for one call: the fastest measured of the records that can take it (but
    `exclude`)."""
    runnable = set(can_take(call)) - exclude
    if call.platform != "gpu":
        return "xla", f"no path was measured faster than the XLA reference on {call.platform}"
    if not call.low_precision:
        return "xla", "float32 inputs: cuDNN and the Hopper kernels take bf16 or f16 only"
    chosen = fastest_measured(call.form, call.dropout, runnable)
    if chosen is not None:
        return chosen
    if "cudnn" in runnable:  # unmeasured form: cuDNN with the terms materialised beat xla wherever measured
        return "cudnn", f"{call.form} bias without attention dropout: cuDNN (unmeasured case; faster than xla " \
                        "wherever measured)"
    return "xla", "no faster path can run this call"


def choose(*, platform: str, hopper: bool, low_precision: bool, form: str, dropout: bool, cudnn_can: bool = True,
           kernel_can: bool = True) -> tuple[str, str]:
    """`choose_for` on facts given one by one: platform (jax's backend), hopper (every GPU of compute capability
    9.x), low_precision (bf16/f16 inputs), form (BIAS_FORMS), dropout; `cudnn_can` / `kernel_can` False rule those
    paths out (e.g. Shaw's vectors, per-example positions)."""
    call = Call(platform=platform, gpu_capability="9.0" if hopper else "8.0" if platform == "gpu" else "",
                low_precision=low_precision, form=form, dropout=dropout)
    exclude = frozenset(({"cudnn"} if not cudnn_can else set()) | ({"pallas", "mosaic_gpu"} if not kernel_can
                                                                   else set()))
    return choose_for(call, exclude)
