"""attention_impl="auto": for each attention call, the fastest measured implementation that can run it.

The choice reads the records of jaxpos.attention.registry.IMPLEMENTATIONS: which can take the call (`lacks`) and
their measured BERT-base masked-LM step times per bias form and attention dropout (`step_ms`, bench/RESULTS.md,
"MLM step per path"). A path counts as faster only by more than `MARGIN`, else the one of lower `tie_rank` keeps
the call. Where nothing was measured (CPU, TPU, float32 on a GPU) the call takes the XLA reference. Pure: `attend`
gathers the facts of a call and logs the choice once.
"""

from __future__ import annotations

from jaxpos.attention.registry import BIAS_FORMS, IMPLEMENTATIONS, Call, can_take

# Three times the spread of the baseline measured twice in that run (35.5 and 36.0 ms: 1.4%).
MARGIN = 0.05

__all__ = ["BIAS_FORMS", "MARGIN", "choose_for", "fastest_measured", "preference", "step_ms"]


def step_ms() -> dict[tuple[str, bool], dict[str, float]]:
    """The records' step times by case: {(form, dropout): {path: ms}} (tests check them against
    bench/RESULTS.md)."""
    table: dict = {}
    for impl in IMPLEMENTATIONS.values():
        for case, ms in impl.step_ms.items():
            table.setdefault(case, {})[impl.name] = ms
    return table


def preference() -> tuple[str, ...]:
    """On a tie, the lower tie_rank: cuDNN (a vendor kernel, compiled in seconds), the XLA reference, then the
    Hopper kernels (about 100 s more compilation per program)."""
    return tuple(sorted(IMPLEMENTATIONS, key=lambda name: IMPLEMENTATIONS[name].tie_rank))


def fastest_measured(form: str, dropout: bool, runnable: set[str]) -> tuple[str, str] | None:
    """(path, why) from the measured step times among `runnable` paths, or None when none of them was measured
    for the case."""
    measured = {path: ms for path, ms in step_ms().get((form, dropout), {}).items() if path in runnable}
    if not measured:
        return None
    best = min(measured.values())
    path = next(p for p in preference() if p in measured and measured[p] <= best * (1 + MARGIN))
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
