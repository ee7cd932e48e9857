"""Generators of the fabrics the tests and benchmarks use, each a ``Topology``.

- ``dgx1``: the DGX-1 (V100) hybrid cube-mesh, or the subset of its GPUs a scheduler handed out
  (``dgx1_allocations`` lists the fragmented ones). NVLink pairs carry one or two 25 GB/s links
  each way (the published ``nvidia-smi topo`` matrix below); pairs without NVLink fall back to
  PCIe, where every transfer also draws on the sending GPU's port out, the receiving GPU's port in
  and, across sockets, the QPI link: shared media, so PCIe paths do not add up as if private.
- ``full_mesh``, ``ring``: symmetric fabrics whose optima are known (tests).
- ``pcie_only``: GPUs with no NVLink, all traffic through their PCIe ports.
- ``multi_machine``: machines of fully connected GPUs; between machines every GPU pair has a link
  that draws on both machines' NICs (one NIC each way per machine).
- ``mixed_reliability``: ``multi_machine`` whose inter-machine links are reliable (expensive optics)
  or cheap (stretched optics, lossy), as RAIL's fabrics are.

Invariant: generators are pure functions of their arguments; every figure is a named constant.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from .topology import Link, Medium, Topology

NVLINK_BW = 25e9  # bytes/s per NVLink2 link, each way
NVLINK_LATENCY = 2e-6
PCIE_BW = 12e9  # bytes/s a GPU's PCIe 3.0 x16 port carries each way
QPI_BW = 8e9  # bytes/s of GPU peer traffic across the sockets' interconnect
PCIE_LATENCY = 5e-6
NIC_BW = 12.5e9  # 100 Gb/s
NET_LATENCY = 10e-6

# NVLinks between DGX-1V GPU pairs (each way): nvidia-smi topo -m of a DGX-1 with V100s.
DGX1_NVLINKS: dict[tuple[int, int], int] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}  # fmt: skip
DGX1_SOCKET = (0, 0, 0, 0, 1, 1, 1, 1)  # GPUs 0-3 hang off CPU 0, 4-7 off CPU 1


def dgx1(gpus: Sequence[int] = tuple(range(8))) -> Topology:
    """The DGX-1V fabric among ``gpus`` (a subset as a scheduler allocates it), ranks in that order."""
    if len(set(gpus)) != len(gpus) or not all(0 <= g < 8 for g in gpus):
        raise ValueError(f"gpus {list(gpus)} are not distinct GPU ids 0-7 of a DGX-1")
    names = tuple(f"gpu{g}" for g in gpus)
    media = {f"pcie{g}:out": PCIE_BW for g in gpus} | {f"pcie{g}:in": PCIE_BW for g in gpus}
    links = []
    for (i, a), (j, b) in itertools.permutations(enumerate(gpus), 2):
        width = DGX1_NVLINKS.get((min(a, b), max(a, b)), 0)
        if width:
            links.append(Link(i, j, width * NVLINK_BW, NVLINK_LATENCY))
            continue
        path = [f"pcie{a}:out", f"pcie{b}:in"]
        if DGX1_SOCKET[a] != DGX1_SOCKET[b]:
            qpi = f"qpi:{DGX1_SOCKET[a]}>{DGX1_SOCKET[b]}"
            media[qpi] = QPI_BW
            path.append(qpi)
        links.append(Link(i, j, PCIE_BW, PCIE_LATENCY, media=tuple(path)))
    return Topology(names, tuple(links), ("dgx1",) * len(gpus), _media(media))


def dgx1_allocations(sizes: Iterable[int] = range(3, 8)) -> list[tuple[int, ...]]:
    """Every set of GPUs of each size a scheduler could hand out on one DGX-1."""
    return [combo for size in sizes for combo in itertools.combinations(range(8), size)]


def full_mesh(ranks: int, bandwidth: float, latency: float = 0.0) -> Topology:
    """Every ordered pair linked at the same bandwidth (the symmetric case with known optima)."""
    links = tuple(Link(a, b, bandwidth, latency) for a, b in itertools.permutations(range(ranks), 2))
    return Topology(tuple(f"r{r}" for r in range(ranks)), links)


def ring(ranks: int, bandwidth: float, latency: float = 0.0) -> Topology:
    """Each rank linked both ways to its two neighbours on a cycle only."""
    pairs = {(r, (r + step) % ranks) for r in range(ranks) for step in (1, -1)} - {
        (r, r) for r in range(ranks)
    }
    links = tuple(Link(a, b, bandwidth, latency) for a, b in sorted(pairs))
    return Topology(tuple(f"r{r}" for r in range(ranks)), links)


def pcie_only(gpus: int = 2) -> Topology:
    """GPUs on one PCIe switch, no NVLink: every pair through the two GPUs' ports."""
    media = {f"pcie{g}:{way}": PCIE_BW for g in range(gpus) for way in ("out", "in")}
    links = tuple(
        Link(a, b, PCIE_BW, PCIE_LATENCY, media=(f"pcie{a}:out", f"pcie{b}:in"))
        for a, b in itertools.permutations(range(gpus), 2)
    )
    return Topology(tuple(f"gpu{g}" for g in range(gpus)), links, media=_media(media))


def multi_machine(
    machines: int,
    gpus_per_machine: int,
    intra_bw: float = NVLINK_BW,
    nic_bw: float = NIC_BW,
    net_cost: float | Sequence[Sequence[float]] = 1.0,
    net_loss: float | Sequence[Sequence[float]] = 0.0,
) -> Topology:
    """``machines`` x ``gpus_per_machine`` ranks (``m1g0`` ...); inside a machine a full mesh at
    ``intra_bw`` (no loss, no cost: wires on a board); between machines a link per GPU pair through
    both NICs. ``net_cost``/``net_loss`` are one value or a machines x machines matrix: the cost of
    the optics from one machine to another (counted once per ordered machine pair, on the link
    between their first GPUs, so a fabric's cost is its optics') and the loss of every link
    between them."""
    names, hosts = [], []
    for m, g in itertools.product(range(machines), range(gpus_per_machine)):
        names.append(f"m{m}g{g}")
        hosts.append(f"m{m}")
    media = {f"nic{m}:{way}": nic_bw for m in range(machines) for way in ("out", "in")}
    links = []
    for a, b in itertools.permutations(range(len(names)), 2):
        ma, mb = divmod(a, gpus_per_machine)[0], divmod(b, gpus_per_machine)[0]
        if ma == mb:
            links.append(Link(a, b, intra_bw, NVLINK_LATENCY))
            continue
        first_pair = a % gpus_per_machine == 0 and b % gpus_per_machine == 0
        cost = _entry(net_cost, ma, mb) if first_pair else 0.0
        loss = _entry(net_loss, ma, mb)
        links.append(Link(a, b, nic_bw, NET_LATENCY, loss, cost, (f"nic{ma}:out", f"nic{mb}:in")))
    return Topology(tuple(names), tuple(links), tuple(hosts), _media(media))


RELIABLE_LOSS = 1e-8  # IEEE-compliant optics
CHEAP_LOSS = 1e-4  # stretched-reach optics (RAIL: 1-5% of paths fall below the standard once stretched)
RELIABLE_COST = 1.0
CHEAP_COST = 0.6  # per machine pair, relative to reliable optics (an assumption, stated in the bench)


def mixed_reliability(
    machines: int, gpus_per_machine: int, reliable_machines: Iterable[int], *, all_reliable: bool = False
) -> Topology:
    """``multi_machine`` whose links among ``reliable_machines`` use reliable optics and every
    other inter-machine link cheap, lossy optics (``all_reliable``: every link reliable)."""
    island = set(reliable_machines)

    def reliable(a: int, b: int) -> bool:
        return all_reliable or (a in island and b in island)

    cost = [
        [RELIABLE_COST if reliable(a, b) else CHEAP_COST for b in range(machines)] for a in range(machines)
    ]
    loss = [
        [RELIABLE_LOSS if reliable(a, b) else CHEAP_LOSS for b in range(machines)] for a in range(machines)
    ]
    return multi_machine(machines, gpus_per_machine, net_cost=cost, net_loss=loss)


def _entry(value: float | Sequence[Sequence[float]], a: int, b: int) -> float:
    return float(value) if isinstance(value, int | float) else float(value[a][b])


def _media(capacities: dict[str, float]) -> tuple[Medium, ...]:
    return tuple(Medium(name, bandwidth) for name, bandwidth in sorted(capacities.items()))
