#!/usr/bin/env bash
# Order sensitivity per positional mechanism at tiny scale: pretrain the tiny BERT (configs/mlm/tiny.py, the
# demo's budget) once per mechanism, fine-tune each on the offline word-order task (configs/finetune/tiny.py:
# original vs locally shuffled vs globally swapped sentences), and print dev accuracy against chance.
#
#   launch/finetune_table.sh runs/order none absolute tisa diet_rel diet_abs t5
#
# Each argument after the workdir is a mechanism, optionally followed by more --config overrides (quoted).
# A mechanism whose runs already finished is not run again (both commands resume from their checkpoints).
set -euo pipefail
OUT=${1:?usage: finetune_table.sh WORKDIR MECHANISM...}; shift
JAXPOS=${JAXPOS:-jaxpos}
mkdir -p "$OUT"
for spec in "$@"; do
  read -r kind extra <<<"$spec"
  name=$kind$(echo "$extra" | tr -dc 'a-zA-Z0-9=' | sed 's/configmodelposition//g; s/=/_/g')
  # shellcheck disable=SC2086
  $JAXPOS train --config configs/mlm/tiny.py --workdir "$OUT/$name/pretrain" \
    --config.model.position.kind="$kind" $extra >"$OUT/$name.pretrain.log" 2>&1
  $JAXPOS finetune --config configs/finetune/tiny.py --init "$OUT/$name/pretrain" \
    --workdir "$OUT/$name/word_order" >"$OUT/$name.finetune.log" 2>&1
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
print("| mechanism | MLM eval loss | word-order dev accuracy (last) | best over evaluations | chance |")
print("| --- | --- | --- | --- | --- |")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*", "word_order", "report.json"))):
    run = os.path.dirname(os.path.dirname(path))
    ft = json.load(open(path))
    mlm = json.load(open(os.path.join(run, "pretrain", "report.json")))
    print(f"| {os.path.basename(run)} | {mlm['eval']['loss']:.3f} | {ft['dev']['dev']['accuracy']:.3f} | "
          f"{ft['best']['dev']['accuracy']:.3f} | {ft['chance']['accuracy']:.3f} |")
PY
