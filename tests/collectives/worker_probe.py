"""Under torchrun (3 ranks, gloo): ``probe`` over loopback, and over a paced fabric whose ranks 0
and 2 are joined by slow links only; each rank writes both measured topologies."""

from __future__ import annotations

from cloud.training.collectives.fabric import PacedFabric
from cloud.training.collectives.probe import probe
from cloud.training.collectives.topology import Link, Topology
from tests.harness.torchrun import init_worker, write_result

FAST, SLOW, LATENCY = 50e6, 5e6, 2e-3


def declared() -> Topology:
    speeds = {(0, 1): FAST, (1, 2): FAST, (0, 2): SLOW}
    links = tuple(Link(s, d, bw, LATENCY) for (a, b), bw in speeds.items() for s, d in ((a, b), (b, a)))
    return Topology(("r0", "r1", "r2"), links)


def main() -> None:
    rank, _ = init_worker()
    loopback = probe(nbytes=1 << 20, repeats=2)
    paced = probe(nbytes=1 << 20, repeats=2, fabric=PacedFabric(declared(), rank))
    write_result({"loopback": loopback.to_dict(), "paced": paced.to_dict(), "declared": declared().to_dict()})


if __name__ == "__main__":
    main()
