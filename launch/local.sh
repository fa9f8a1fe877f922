#!/usr/bin/env bash
# One host, one process: `jaxpos train` over every local device (a GPU, the GPUs of one machine as one data/fsdp/
# tensor mesh, a single-host TPU VM, or the CPU). No jax.distributed: there is nothing to coordinate.
#
#   launch/local.sh configs/mlm/bert_base.py runs/base --config.model.position.kind=diet_rel
#   GPU=1 launch/local.sh configs/mlm/bert_base.py runs/base      # GPU 1 only (CUDA_VISIBLE_DEVICES=1)
#   INSTALL=1 launch/local.sh configs/mlm/bert_base.py runs/base  # the install step first (JAX_EXTRA=cuda12)
#   DRY_RUN=1 launch/local.sh configs/mlm/bert_base.py runs/base  # or --dry-run first: print the commands only
#
# JAXPOS names the command (default: this checkout's .venv/bin/jaxpos).
set -euo pipefail
if [ "${1:-}" = --dry-run ]; then DRY_RUN=1; shift; fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=launch/common.sh
source "$ROOT/launch/common.sh"
config=${1:?usage: launch/local.sh CONFIG WORKDIR [--config.a.b=value ...]}
workdir=${2:?usage: launch/local.sh CONFIG WORKDIR [--config.a.b=value ...]}
shift 2

if [ -n "${INSTALL:-}" ]; then
  run bash -c "$(install_line "$ROOT" "${JAX_EXTRA-cuda12}")"
fi
pin=()
if [ -n "${GPU:-}" ]; then pin=(env "CUDA_VISIBLE_DEVICES=$GPU"); fi
run ${pin[@]+"${pin[@]}"} "${JAXPOS:-$ROOT/.venv/bin/jaxpos}" train --config "$config" --workdir "$workdir" "$@"
