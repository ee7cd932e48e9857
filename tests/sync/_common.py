"""Shared by the torchrun workers in tests/sync: process-group setup and result files."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def init() -> tuple[int, int]:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def write_result(result: dict) -> None:
    """Each rank writes <out>/rank<r>.json; the test reads them after torchrun exits."""
    out = Path(sys.argv[1])
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    os.environ.pop("MASTER_PORT", None)
