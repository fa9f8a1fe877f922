#!/usr/bin/env bash
# DIET Table 4 at small scale: the tiny encoder-decoder on the offline Bible corpus (de -> en), one run per
# positional mechanism, each pinned to its own 2 CPU cores and stopped (SIGTERM: it checkpoints and exits) after
# MINUTES of training; then `jaxpos eval-bleu` decodes each run's test split, and the table gives test SacreBLEU per
# mechanism against copying the source.
#
#   MINUTES=20 launch/translation_table.sh runs/table4 tisa diet_rel diet_abs absolute "absolute --config.data.pack=False"
#
# Each argument after the workdir is a mechanism, optionally followed by more --config overrides.
set -euo pipefail
OUT=${1:?usage: translation_table.sh WORKDIR MECHANISM...}; shift
MINUTES=${MINUTES:-20}  # or BUDGET_S seconds
JAXPOS=${JAXPOS:-jaxpos}
mkdir -p "$OUT"
core=0
for spec in "$@"; do
  read -r kind extra <<<"$spec"
  name=$kind$(echo "$extra" | tr -dc 'a-zA-Z0-9=' | sed 's/configdata//g; s/=/_/g')
  # shellcheck disable=SC2086
  JAX_PLATFORMS=cpu taskset -c "$core,$((core + 1))" timeout -s TERM "${BUDGET_S:-$((MINUTES * 60))}" \
    $JAXPOS train --config configs/wmt/tiny.py --workdir "$OUT/$name" --config.model.position.kind="$kind" \
    --config.train.num_steps=100000 --config.train.eval_every=500 $extra >"$OUT/$name.log" 2>&1 &
  core=$((core + 2))
done
wait || true  # each run ends on its SIGTERM: checkpointed, exit status 143
for spec in "$@"; do
  read -r kind extra <<<"$spec"
  name=$kind$(echo "$extra" | tr -dc 'a-zA-Z0-9=' | sed 's/configdata//g; s/=/_/g')
  JAX_PLATFORMS=cpu $JAXPOS eval-bleu --workdir "$OUT/$name" >"$OUT/$name.bleu" 2>>"$OUT/$name.log" &
done
wait
$JAXPOS curves "$OUT"/*/ --out "$OUT/curves.png"  # steps and dev loss of every run, one figure
python3 - "$OUT" <<'PY'
import glob, os, re, sys
print(f"{'run':<28} {'steps':>6} {'test BLEU':>10} {'copy BLEU':>10}")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.bleu"))):
    text = open(path).read()
    patterns = (r"step (\d+)", r"SacreBLEU ([\d.]+)", r"copying the source: ([\d.]+)")
    step, bleu, copy = (re.search(p, text) for p in patterns)
    if not (step and bleu and copy):
        print(f"{os.path.basename(path)[:-5]:<28} no checkpoint decoded (see its .log)")
        continue
    print(f"{os.path.basename(path)[:-5]:<28} {step[1]:>6} {float(bleu[1]):>10.2f} {float(copy[1]):>10.2f}")
PY
