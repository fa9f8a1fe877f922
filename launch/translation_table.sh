#!/usr/bin/env bash
# DIET Table 4 at small scale: the tiny encoder-decoder on the offline Bible corpus (de -> en), one run per
# positional mechanism, each pinned to its own 2 CPU cores and stopped (SIGTERM: checkpoint, then test BLEU)
# after MINUTES of training; prints test SacreBLEU per mechanism against copying the source.
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
wait || true
python3 - "$OUT" <<'PY'
import glob, json, os, sys
print(f"{'run':<28} {'steps':>6} {'dev loss':>9} {'test BLEU':>10} {'copy BLEU':>10}")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*", "report.json"))):
    r = json.load(open(path))
    print(f"{os.path.basename(os.path.dirname(path)):<28} {r['step']:>6} {r['dev'].get('loss', float('nan')):>9.3f} "
          f"{r.get('test_bleu', float('nan')):>10.2f} {r.get('copy_source_bleu', float('nan')):>10.2f}")
PY
