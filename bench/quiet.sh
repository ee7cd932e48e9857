#!/bin/bash
# Run one benchmark command with its processes favoured by the scheduler on a shared machine. From
# the repository root (benchmarks are modules of the bench package):
#   bench/quiet.sh .venv/bin/python -m bench.pipeline --quick
# With the kernel's autogroup scheduling (the default on desktop and many server kernels), plain
# `nice` only ranks processes within their own session, so the command runs in a new session whose
# autogroup gets nice -20 (root only). torchrun starts workers in sessions of their own; their
# autogroups are raised too, while the command runs. Other jobs still share caches and memory
# bandwidth: figures from a truly idle machine remain the reference.
set -u
setsid bash -c 'echo -20 > /proc/$$/autogroup || exit 1; exec "$@"' quiet "$@" &
root=$!
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
while kill -0 "$root" 2>/dev/null; do
  for p in $(descendants "$root"); do echo -20 > "/proc/$p/autogroup" 2>/dev/null; done
  sleep 0.2
done
wait "$root"
