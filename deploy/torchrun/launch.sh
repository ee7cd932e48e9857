#!/usr/bin/env bash
# Launch a pipeline-parallel training job on one node of an M-node torchrun job (c10d rendezvous).
#
#   deploy/torchrun/launch.sh JOB.toml NNODES NPROC_PER_NODE RDZV_HOST[:PORT] [RDZV_ID]
#
# Run the same command on every node. The first node to arrive hosts nothing special: the c10d
# store lives at RDZV_HOST:PORT (default port 29400), which must be reachable from every node.
# The job's checkpoint dir must be on a file system all nodes share (each stage writes its own
# files; resume needs to see all of them). Single machine: NNODES=1 and RDZV_HOST=127.0.0.1, or
# use `python -m torch.distributed.run --standalone` (what cloud.jobs.torchrun.launch_job runs).
#
# Where the host name does not say which node is which (containers, network namespaces sharing one
# host name), set per node: LOCAL_ADDR=<this node's address> (what its peers connect to) and, on the
# node at RDZV_HOST, RDZV_IS_HOST=1 (it hosts the store; torchrun otherwise guesses by host name).
set -euo pipefail

if [[ $# -lt 4 ]]; then
    sed -n '2,15p' "$0" >&2
    exit 2
fi
JOB=$1
NNODES=$2
NPROC=$3
ENDPOINT=$4
RDZV_ID=${5:-edgefed-$(basename "$JOB" .toml)}
[[ $ENDPOINT == *:* ]] || ENDPOINT="$ENDPOINT:29400"

HERE=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-$HERE/.venv/bin/python}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
# gloo picks the interface of the host name by default; set GLOO_SOCKET_IFNAME=eth0 (or similar)
# when nodes have several interfaces.

EXTRA=()
[[ -n ${LOCAL_ADDR:-} ]] && EXTRA+=(--local-addr "$LOCAL_ADDR")
[[ -n ${RDZV_IS_HOST:-} ]] && EXTRA+=(--rdzv-conf "is_host=$RDZV_IS_HOST")

exec "$PYTHON" -m torch.distributed.run \
    "${EXTRA[@]}" \
    --nnodes "$NNODES" \
    --nproc-per-node "$NPROC" \
    --rdzv-backend c10d \
    --rdzv-endpoint "$ENDPOINT" \
    --rdzv-id "$RDZV_ID" \
    --max-restarts 0 \
    -m cloud.training.run --job "$JOB"
