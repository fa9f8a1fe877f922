#!/usr/bin/env bash
# Multi-host TPU pod: run the same command on every worker; jax.distributed finds the coordinator itself.
#   launch/tpu_pod.sh TPU_NAME ZONE configs/mlm/diet.py /shared/runs/diet [--config.x=y ...]
# Assumes the repository is checked out at ~/jaxpos on every worker with `make install` done there.
set -euo pipefail
tpu=${1:?tpu name}; zone=${2:?zone}; config=${3:?config}; workdir=${4:?workdir}; shift 4
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command \
  "cd ~/jaxpos && .venv/bin/jaxpos train --distributed --config $config --workdir $workdir $*"
