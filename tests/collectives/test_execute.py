"""Must show 1 of issue 25: programs run by ``Executor`` under real torchrun (2, 3 and 4 ranks,
gloo) equal torch.distributed's all_reduce, broadcast and reduce, for ring, double binary tree,
packed-tree and chain programs, sizes 1 element to 64 MB, odd ones included (worker_execute.py);
integer-valued sums bit-identical, float ones within tolerance."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.torchrun import run_workers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_programs_equal_torch_distributed(tmp_path: Path, world: int) -> None:
    results = run_workers("tests.collectives.worker_execute", tmp_path, nproc=world, timeout_s=900)
    for rank, result in enumerate(results):
        assert result["failures"] == [], (rank, result["failures"])
    # every rank checked every all-reduce and broadcast case, the root every reduce case as well
    assert max(r["cases"] for r in results) > min(r["cases"] for r in results) > 0
