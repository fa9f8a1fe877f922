#!/usr/bin/env bash
# A TPU VM pod slice: the same `jaxpos train --distributed` on every worker (`gcloud compute tpus tpu-vm ssh
# --worker=all`). jax.distributed.initialize() reads the coordinator, the process count and each worker's id from
# the TPU VM environment, so no address is passed by hand.
#
#   launch/tpu_pod.sh TPU_NAME ZONE CONFIG WORKDIR [--config.a.b=value ...]
#   launch/tpu_pod.sh my-v4-32 us-central2-b configs/mlm/diet.py gs://BUCKET/runs/diet \
#       --config.data.source=tfds --config.data.tfds_name=wikipedia/20230601.en --config.data.data_dir=gs://BUCKET/tfds
#   DRY_RUN=1 launch/tpu_pod.sh ...     # or --dry-run first: print the commands, run none
#
# Steps: (1) pack this checkout (git ls-files: tracked and new unignored files) and copy it to every worker,
# (2) the project's install step there (make install into ~/jaxpos/.venv, then jax[tpu]), (3) train. SKIP_SETUP=1
# skips (1)-(2) on a pod set up before. WORKDIR should be a gs:// URL that every worker writes its checkpoint
# shards to. PROJECT sets gcloud's --project; JAX_EXTRA (default tpu) the jax build; REMOTE_DIR (default jaxpos,
# under each worker's home) the checkout there. The run lasts as long as this ssh session: start it in tmux.
set -euo pipefail
if [ "${1:-}" = --dry-run ]; then DRY_RUN=1; shift; fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=launch/common.sh
source "$ROOT/launch/common.sh"
usage="usage: launch/tpu_pod.sh TPU_NAME ZONE CONFIG WORKDIR [--config.a.b=value ...]"
tpu=${1:?$usage}; zone=${2:?$usage}; config=${3:?$usage}; workdir=${4:?$usage}
shift 4
remote_dir=${REMOTE_DIR:-jaxpos}
gcloud_args=(--zone="$zone" --worker=all)
if [ -n "${PROJECT:-}" ]; then gcloud_args+=(--project="$PROJECT"); fi

if [ -z "${SKIP_SETUP:-}" ]; then
  archive=${TMPDIR:-/tmp}/jaxpos-src.tgz
  run bash -c "git -C $(words "$ROOT") ls-files -z -co --exclude-standard | tar -C $(words "$ROOT") --null -T - \
-czf $(words "$archive")"
  run gcloud compute tpus tpu-vm scp "$archive" "$tpu:/tmp/jaxpos-src.tgz" "${gcloud_args[@]}"
  unpack="mkdir -p $(words "$remote_dir") && tar -xzf /tmp/jaxpos-src.tgz -C $(words "$remote_dir")"
  run gcloud compute tpus tpu-vm ssh "$tpu" "${gcloud_args[@]}" \
    --command="$unpack && $(install_line "$remote_dir" "${JAX_EXTRA-tpu}")"
fi
train=$(words .venv/bin/jaxpos train --distributed --config "$config" --workdir "$workdir" "$@")
run gcloud compute tpus tpu-vm ssh "$tpu" "${gcloud_args[@]}" --command="cd $(words "$remote_dir") && $train"
