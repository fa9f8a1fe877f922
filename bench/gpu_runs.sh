#!/usr/bin/env bash
# The pending GPU measurements of bench/RESULTS.md, as device calls of under 10 minutes each, in priority order.
#
#   bash bench/gpu_runs.sh wheels          # here, once: the packages the GPU image lacks, into .whl/ (git-ignored)
#   bash bench/gpu_runs.sh kernels         # there (carry .whl): compiled kernel tests, then target 2's table
#   bash bench/gpu_runs.sh train           # there: target 1 through cuDNN and the Hopper kernels
#   bash bench/gpu_runs.sh profile         # there: kernel time by name (tisa: mosaic_gpu, cudnn); dropout recipe
#   bash bench/gpu_runs.sh variants        # there: causal, head width 128, DIET-Abs rank 16 (items 11, 13, target 3)
#   bash bench/gpu_runs.sh peers           # there: target 1's peers at both shapes, decoding (target 4)
#   DRY_RUN=1 bash bench/gpu_runs.sh STAGE # print a stage's commands (`+ argv`, as launch/) without running them
#
# Each command runs under its own time limit, so a hang (a barrier the compiled kernels never meet) costs that
# limit, not the call; what it prints goes to $OUT/STAGE.log (or runs/gpu/STAGE.log without $OUT) and a summary
# of exit codes and seconds ends the output. Device time is 30 minutes a session: kernels, train and profile fit.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=launch/common.sh
source launch/common.sh

STAGE="${1:-}"
PY="${PYTHON:-python3}"
# What jaxpos imports that the GPU image (jax 0.11.2, Python 3.12) lacks; their own needs are in the image.
WHEELS=(ml-collections==1.1.0 tensorboardX==2.6.4)

die() { echo "gpu_runs: error: $*" >&2; exit 2; }

download_wheels() {
  mkdir -p .whl
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "${WHEELS[@]}" \
    || die "pip download failed"
  ls -l .whl
}

install_wheels() {
  compgen -G ".whl/*.whl" > /dev/null || return 0
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || die "installing the carried wheels failed"
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
}

SUMMARY=()
# step LIMIT_S TITLE COMMAND...: run one measurement under its own limit, log it, remember its exit code.
step() {
  local limit="$1" title="$2"; shift 2
  [ -n "${DRY_RUN:-}" ] || printf '\n===== %s\n' "$title"
  local start=$SECONDS rc
  run timeout -k 10 "$limit" "$@"
  rc=$?
  SUMMARY+=("$(printf '%-48s rc %3d  %4d s' "$title" "$rc" "$((SECONDS - start))")")
}

kernels() {
  step 270 "compiled kernel tests (Mosaic GPU, Triton, model)" env JAX_PLATFORMS=cuda "$PY" -m pytest -q \
    --maxfail=3 -p no:cacheprovider tests/attention/test_toeplitz_mosaic_gpu.py \
    tests/attention/test_toeplitz_kernel.py tests/models/test_implementations.py -k "not tpu"
  step 290 "attention fwd+bwd, T 512/2048/8192 (target 2)" "$PY" bench/attention_bias.py --paths \
    cudnn,jax-fa3,cudnn+bias,pallas,pallas+table,mgpu,mgpu+table,mgpu+dropout,mgpu+segments,mgpu+folded
}

train() {
  step 560 "MLM step, cuDNN vs Hopper kernels (target 1)" "$PY" bench/train_throughput.py --shapes 32x512 \
    --kinds none,tisa,diet_rel,alibi --impl cudnn,mosaic_gpu --peers ''
}

profile() {
  step 200 "profile: tisa through mosaic_gpu" "$PY" -m bench.profile_step --kind tisa --impl mosaic_gpu
  step 160 "profile: tisa through cudnn" "$PY" -m bench.profile_step --kind tisa --impl cudnn
  step 180 "MLM step with attention dropout 0.1 (recipes)" "$PY" bench/train_throughput.py --shapes 32x512 \
    --kinds tisa --impl xla,pallas,mosaic_gpu --attention-dropout 0.1 --peers ''
}

variants() {
  step 200 "attention, causal (item 11)" "$PY" bench/attention_bias.py --causal --lengths 512,2048 --paths \
    cudnn,cudnn+bias,mgpu,mgpu+table,mgpu+dropout
  step 180 "attention, head width 128 (item 13)" "$PY" bench/attention_bias.py --head-dim 128 \
    --lengths 512,2048 --paths cudnn,jax-fa3,mgpu,mgpu+table,mgpu+segments
  step 150 "attention, DIET-Abs rank 16 (target 3)" "$PY" bench/attention_bias.py --rank 16 --paths \
    cudnn,mgpu,cudnn+folded,mgpu+folded
}

peers() {
  step 300 "MLM step, none and its peers, 2 shapes (target 1)" "$PY" bench/train_throughput.py \
    --shapes 32x512,256x128 --kinds none --impl cudnn --peers plain_jax,huggingface
  step 240 "cached beam search per mechanism (target 4)" "$PY" bench/decode_throughput.py --batches 2 \
    --kinds none,tisa,diet_rel,t5,alibi,rope
}

case "$STAGE" in
  wheels) download_wheels; exit ;;
  kernels|train|profile|variants|peers) ;;
  *) die "usage: [DRY_RUN=1] bash bench/gpu_runs.sh wheels|kernels|train|profile|variants|peers" ;;
esac

if [ -n "${DRY_RUN:-}" ]; then "$STAGE"; exit 0; fi
LOG_DIR="${OUT:-runs/gpu}"
mkdir -p "$LOG_DIR"
exec > >(tee "$LOG_DIR/$STAGE.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
install_wheels
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
"$PY" -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax',
optax.__version__, jax.devices())"
git log -1 --format='commit %h %s' 2>/dev/null || true
"$STAGE"
printf '\n===== summary (%s)\n' "$STAGE"
printf '%s\n' "${SUMMARY[@]}"
