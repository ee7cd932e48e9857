"""``probe`` under real torchrun (3 ranks): every rank gets the same measured topology, with a link
for every ordered pair; over a paced fabric it finds the slow links slow. Pacing only adds time,
so the bounds below are one-sided: no measured link is faster than declared (with slack for the
round trip it subtracts), none has less latency, and the slow links measure slower than the fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud.training.collectives.topology import from_dict
from tests.harness.torchrun import run_workers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_probe_measures_the_same_fabric_on_every_rank(tmp_path: Path) -> None:
    results = run_workers("tests.collectives.worker_probe", tmp_path, nproc=3, timeout_s=300)
    for name in ("loopback", "paced"):
        assert all(r[name] == results[0][name] for r in results), name
        topology = from_dict(results[0][name])
        pairs = {(link.src, link.dst) for link in topology.links}
        assert pairs == {(a, b) for a in range(3) for b in range(3) if a != b}
        assert all(link.bandwidth > 0 and link.latency >= 0 for link in topology.links)
    declared, paced = from_dict(results[0]["declared"]), from_dict(results[0]["paced"])
    for link in paced.links:
        want = declared.link(link.src, link.dst)
        assert want is not None
        assert link.bandwidth <= want.bandwidth * 1.5, (link, want)
        assert link.latency >= want.latency * 0.9, (link, want)
    slow = max(link.bandwidth for link in paced.links if {link.src, link.dst} == {0, 2})
    fast = min(link.bandwidth for link in paced.links if {link.src, link.dst} != {0, 2})
    assert slow < fast, paced
