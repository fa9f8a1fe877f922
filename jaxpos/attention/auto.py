"""attention_impl="auto": for each attention call, the fastest measured path that can run it.

The choice reads `STEP_MS`, BERT-base masked-LM train steps measured per bias form, attention dropout and path
(bench/RESULTS.md, "MLM step per path"); a path counts as faster only by more than `MARGIN`, else the earlier one
in `PREFERENCE` keeps the call. Where nothing was measured (CPU, TPU, float32 on a GPU) the call takes the XLA
reference. The function here is pure: `attend` gathers the facts of a call and logs the choice once.
"""

from __future__ import annotations

# Fastest of 20 steps (ms), BERT-base 32 x 512, bf16 compute, float32 parameters, one NVIDIA H200, jax 0.11.2,
# 2026-11-26. "none": no positional logits (none, absolute); "table": a Toeplitz table (TISA; DIET-Rel, T5 and
# ALiBi within 1.5% of it on both measured paths); "factors": low-rank factors folded into q and k (DIET-Abs).
STEP_MS = {
    ("none", False): {"cudnn": 35.5, "mosaic_gpu": 34.2},
    ("table", False): {"cudnn": 39.2, "mosaic_gpu": 38.2},
    ("factors", False): {"cudnn": 41.9, "mosaic_gpu": 37.4},
    ("none", True): {"xla": 45.6, "mosaic_gpu": 38.6},
    ("table", True): {"xla": 54.7, "mosaic_gpu": 41.5},
    ("factors", True): {"xla": 49.1, "mosaic_gpu": 40.0},
}
# Three times the spread of the baseline measured twice in that run (35.5 and 36.0 ms: 1.4%).
MARGIN = 0.05
# On a tie: cuDNN (a vendor kernel, compiled in seconds), then the XLA reference, then the Hopper kernels (about
# 100 s more compilation per program).
PREFERENCE = ("cudnn", "xla", "mosaic_gpu")
BIAS_FORMS = ("none", "table", "factors", "other")


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


def choose(*, platform: str, hopper: bool, low_precision: bool, form: str, dropout: bool, cudnn_can: bool,
           kernel_can: bool) -> tuple[str, str]:
    """(attention_impl, one-line reason) for one call.

    platform: jax's backend ("gpu", "cpu", "tpu"); hopper: every device is compute capability 9.x;
    low_precision: bf16/f16 inputs; form: one of BIAS_FORMS; dropout: attention dropout in this call;
    cudnn_can / kernel_can: whether `jax.nn.dot_product_attention` / the Toeplitz kernels can express the call.
    """
    if form not in BIAS_FORMS:
        raise ValueError(f"bias form {form!r}; choose {', '.join(BIAS_FORMS)}")
    if platform != "gpu":
        return "xla", f"no path was measured faster than the XLA reference on {platform}"
    if not low_precision:
        return "xla", "float32 inputs: cuDNN and the Hopper kernels take bf16 or f16 only"
    runnable = {"xla"} | ({"cudnn"} if cudnn_can and not dropout else set())
    if hopper and kernel_can:
        runnable.add("mosaic_gpu")
    chosen = fastest_measured(form, dropout, runnable)
    if chosen is not None:
        return chosen
    if "cudnn" in runnable:  # unmeasured form: cuDNN with the terms materialised beat xla wherever measured
        return "cudnn", f"{form} bias without attention dropout: cuDNN (unmeasured case; faster than xla wherever " \
                        "measured)"
    return "xla", "no faster path can run this call"
