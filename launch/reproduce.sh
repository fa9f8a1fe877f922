#!/usr/bin/env bash
# `jaxpos reproduce` spread over the cores or GPUs of one host: plan it (shared tokenizer, a timing that sets the
# steps per run within the budget), start one worker per core (pinned) or GPU, each running the runs that no other
# worker has claimed one after another, then write OUT/REPRODUCTION.md. Workers on other hosts that share OUT
# take part the same way (a claim names its host and process).
#
#   launch/reproduce.sh runs/repro 40 3                 # OUT, budget in minutes (default 30), seeds (default 3)
#   launch/reproduce.sh runs/repro 40 3 --mechanisms absolute,tisa,diet_rel
#   DRY_RUN=1 launch/reproduce.sh runs/repro 40 3       # print what would run; nothing is run or written
#
# WORKERS (default: the number of GPUs, else of CPU cores) runs go at a time; JAXPOS names the command (default
# .venv/bin/jaxpos). Finished runs (OUT/runs/NAME/result.json) are skipped, so a second call resumes.
set -euo pipefail
OUT=${1:?usage: launch/reproduce.sh OUT [BUDGET_MINUTES] [SEEDS] [jaxpos reproduce options...]}
BUDGET=${2:-30}
SEEDS=${3:-3}
shift $(($# < 3 ? $# : 3))
cd "$(dirname "$0")/.."
JAXPOS=${JAXPOS:-.venv/bin/jaxpos}
if command -v nvidia-smi >/dev/null && GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') && [ "$GPUS" -gt 0 ]; then
  DEVICE=gpu; SLOTS=$GPUS
else
  DEVICE=cpu; SLOTS=$(nproc)
fi
WORKERS=${WORKERS:-$SLOTS}
COMMON=(--out "$OUT" --budget-minutes "$BUDGET" --seeds "$SEEDS" --workers "$WORKERS" "$@")

if [ -n "${DRY_RUN:-}" ]; then
  echo "# $WORKERS $DEVICE worker(s); plan (tokenizer, timing, steps per run):"
  echo "$JAXPOS reproduce ${COMMON[*]} --plan-only"
  echo "# then one worker per $DEVICE, pinned:"
  "$JAXPOS" reproduce "${COMMON[@]}" --dry-run
  echo "# and finally:"
  echo "$JAXPOS reproduce ${COMMON[*]} --report-only"
  exit 0
fi

start=$(date +%s)
mkdir -p "$OUT"
"$JAXPOS" reproduce "${COMMON[@]}" --plan-only >"$OUT/plan.log" 2>&1 || { cat "$OUT/plan.log"; exit 1; }
mapfile -t RUNS <"$OUT/runs.txt"
steps=$(grep -m1 'steps per run' "$OUT/plan.log" || echo 'steps from the existing plan')
echo "reproduce: ${#RUNS[@]} runs on $WORKERS $DEVICE worker(s) -> $OUT ($steps)"

worker() {  # worker k, on its own core or GPU: claims and runs the plan's runs one after another
  local k=$1 env pin=()
  if [ "$DEVICE" = gpu ]; then
    env=(CUDA_VISIBLE_DEVICES=$((k % SLOTS)))
  else
    env=(JAX_PLATFORMS=cpu XLA_FLAGS=--xla_cpu_multi_thread_eigen=false)
    command -v taskset >/dev/null && [ "$WORKERS" -le "$SLOTS" ] && pin=(taskset -c "$k")
  fi
  mkdir -p "$OUT/workers"
  if env "${env[@]}" JAX_COMPILATION_CACHE_DIR="$OUT/jax_cache" JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0.3 \
      JAXPOS_WORKER_STARTED="$(date +%s.%N)" "${pin[@]}" "$JAXPOS" reproduce --out "$OUT" --run "$ALL" \
      >"$OUT/workers/$k.log" 2>&1; then
    echo "  worker $k done"
  else
    echo "  worker $k: some runs FAILED: see $OUT/runs/*/failed.txt and $OUT/workers/$k.log"
  fi
}
ALL=$(IFS=,; echo "${RUNS[*]}")
for ((k = 0; k < WORKERS; k++)); do worker "$k" & done
wait
"$JAXPOS" reproduce "${COMMON[@]}" --report-only
echo "reproduce: $(($(date +%s) - start)) s in all"
