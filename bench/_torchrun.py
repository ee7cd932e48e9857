"""Run a benchmark's worker under torchrun (2 processes, gloo) and read rank 0's figures back.

Workers start as ``python -m bench.<name> --worker ...`` (torchrun's ``-m``), from the repository
root and with it on PYTHONPATH, as ``make bench`` starts the benchmark itself.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(module: str, args: list[str], nproc: int = 2, timeout_s: float = 300.0) -> dict:
    """Run ``module`` (e.g. "bench.hetero") with ``--worker`` and ``args`` on ``nproc`` ranks; the
    dict rank 0 passed to ``write_rank_result``."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "BENCH_OUT": out}
        torchrun = Path(sys.executable).with_name("torchrun")
        command = [
            str(torchrun),
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(nproc),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{_free_port()}",
            "-m",
            module,
            "--worker",
            *args,
        ]
        subprocess.run(command, env=env, check=True, timeout=timeout_s, cwd=ROOT)
        return json.loads((Path(out) / "rank0.json").read_text())


def leave_together() -> None:
    """End a worker: wait for every rank, then tear the process group down. A rank that exited
    while its peer was still writing its figures sometimes aborted in gloo's teardown
    ("terminate called without an active exception", about one quick hetero run in five)."""
    dist.barrier()
    dist.destroy_process_group()


def write_rank_result(result: dict, rank: int) -> None:
    (Path(os.environ["BENCH_OUT"]) / f"rank{rank}.json").write_text(json.dumps(result))
