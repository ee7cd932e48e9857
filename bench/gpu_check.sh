#!/usr/bin/env bash
# The device check of issue 21, in one short run (well under 10 minutes):
#   1. python -m bench.pipeline --quick --device D      (ours vs single process / torch's 1F1B)
#   2. python -m bench.compression --quick --device D   (its headline ratios; every case's in its JSON)
#   3. a 2-rank training job: torchrun --nproc-per-node 2 -m cloud.training.run --job <device = D>
# With a GPU, D = cuda: the job's ranks take cuda:0 and cuda:1 with NCCL, or with one GPU both take
# cuda:0 and talk over gloo through CPU memory (NCCL refuses two ranks on one GPU; see
# cloud/training/device.py); the same job then runs on the CPU too, for the GPU/CPU ratio.
# Without a GPU, D = cpu: the CPU fallback (gloo), said so on the first line.
# Each step's output goes to $GPU_CHECK_OUT (default: a new temporary folder); figures are printed.
#
#   bash bench/gpu_check.sh            # PYTHON=... to choose the interpreter (default .venv's)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo "$PWD/.venv/bin/python" || echo python3)}  # absolute: the job runs in its own folder
OUT=${GPU_CHECK_OUT:-$(mktemp -d -t gpu_check.XXXXXX)}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
started=$SECONDS

gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if [ "$gpus" -gt 0 ]; then
  device=cuda
  echo "gpu_check: $gpus GPU(s): $("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0))')"
else
  device=cpu
  echo "gpu_check: no GPU on this machine: running the CPU fallback (gloo); nothing here is a GPU figure"
fi

ratios() {  # the ratios of bench/results/<name>.json, one per line
  "$PYTHON" - "$1" <<'EOF'
import json, sys
from pathlib import Path
doc = json.loads((Path("bench/results") / f"{sys.argv[1]}.json").read_text())
for name, value in doc["ratios"].items():
    if "[" not in name:  # the per-case ratios are in the file
        print(f"  {sys.argv[1]}.{name} = {value:.3f}")
EOF
}

echo "== bench.pipeline --quick --device $device"
timeout 300 "$PYTHON" -m bench.pipeline --quick --device "$device" >"$OUT/pipeline.log" 2>&1 \
  || { tail -30 "$OUT/pipeline.log"; exit 1; }
ratios pipeline

echo "== bench.compression --quick --device $device"
timeout 300 "$PYTHON" -m bench.compression --quick --device "$device" \
  >"$OUT/compression.log" 2>&1 || { tail -30 "$OUT/compression.log"; exit 1; }
ratios compression

job() {  # job <device>: the 2-rank digits job on that device; prints its figures
  local dir="$OUT/job-$1"
  mkdir -p "$dir"
  cat >"$dir/job.toml" <<EOF
[train]
schedule = "1f1b-flush"
microbatches = 4
batch_size = 64
epochs = 2
max_steps = 40
seed = 0
device = "$1"
[partition]
mode = "explicit"
stages = [[0, 4], [5, 8]]
[checkpoint]
dir = "ckpt"
[progress]
file = "progress.jsonl"
log_every = 10
EOF
  (cd "$dir" && timeout 180 "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 2 \
    -m cloud.training.run --job job.toml >torchrun.log 2>&1) || { tail -30 "$dir/torchrun.log"; exit 1; }
  grep -h '^\[train\] rank [0-9]*: device' "$dir/torchrun.log" | sed 's/^/  /'
  "$PYTHON" - "$dir/progress.jsonl" "$1" <<'EOF'
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
steps = [e for e in events if e["event"] == "step"]
evals = [e for e in events if e["event"] == "eval"]
rate = max(e["samples_per_s"] for e in steps[1:] or steps)  # the first window pays the warm-up
print(f"  job[{sys.argv[2]}]: {events[-1]['event']} at step {events[-1]['step']}, loss {steps[-1]['loss']:.3f}, "
      f"accuracy {evals[-1]['accuracy']:.3f}, samples_per_s {rate:.1f}")
open(sys.argv[1] + ".rate", "w").write(str(rate))
EOF
}

echo "== 2-rank job (torchrun --nproc-per-node 2 -m cloud.training.run), device = $device"
job "$device"
if [ "$device" = cuda ]; then
  echo "== the same job on the CPU (gloo)"
  job cpu
  echo "  job.samples_per_s_cuda_vs_cpu = $("$PYTHON" -c "import sys; print(f'{float(open(sys.argv[1]).read()) / float(open(sys.argv[2]).read()):.3f}')" \
    "$OUT/job-cuda/progress.jsonl.rate" "$OUT/job-cpu/progress.jsonl.rate")"
fi
echo "gpu_check: done on $device in $((SECONDS - started)) s; logs and job folders in $OUT"
