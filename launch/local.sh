#!/usr/bin/env bash
# Single-host run (CPU, one GPU, or one TPU VM): every local device joins the mesh.
#   launch/local.sh configs/mlm/tiny.py runs/tiny --config.model.position.kind=diet_rel
set -euo pipefail
config=${1:?config file}; workdir=${2:?workdir}; shift 2
exec "$(dirname "$0")/../.venv/bin/jaxpos" train --config "$config" --workdir "$workdir" "$@"
