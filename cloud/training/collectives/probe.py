"""Measure a job's fabric: per ordered pair of ranks, a latency and a bandwidth, from timed
point-to-point messages, as a ``Topology`` every rank holds identically.

Pairs are measured one at a time in one global order (a, b) for a != b, both ends taking part and
the other ranks moving on to their next pair (a total order, so blocking sends cannot wait in a
cycle). The sender times ``repeats`` round trips of one element (half the fastest is the latency)
and ``repeats`` sends of ``nbytes`` each answered by one element (the fastest, less a round trip,
but never under half of it, gives the bandwidth): the fastest of several, because noise on a
shared host only adds time. Each rank measures the pairs it sends on; one ``all_gather_object``
then hands every rank the same table, so every rank plans the same programs (a plan differing
between ranks would deadlock).
With a ``PacedFabric`` the probe's sends are paced as the executor's are: it measures the
emulated fabric, which is how the tests check it.

Invariant: the returned topology has a link for every ordered pair, with a positive bandwidth and
a non-negative latency, and is equal on every rank of the group.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from cloud.training.collectives.execute import group_wire_device
from cloud.training.collectives.fabric import PacedFabric
from cloud.training.collectives.topology import Link, Topology

PROBE = "probe"  # sync.topology's value that asks for a probe instead of a file


def probe(
    group: dist.ProcessGroup | None = None,
    *,
    nbytes: int = 4 << 20,
    repeats: int = 3,
    fabric: PacedFabric | None = None,
) -> Topology:
    """The group's fabric as measured now (a collective: every rank of the group calls it)."""
    if nbytes < 1 or repeats < 1:
        raise ValueError(f"probe needs nbytes >= 1 and repeats >= 1, got {nbytes}, {repeats}")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    peers = [dist.get_global_rank(group, r) if group is not None else r for r in range(world)]
    device = group_wire_device(group)
    token = torch.zeros(1, dtype=torch.uint8, device=device)
    payload = torch.zeros(nbytes, dtype=torch.uint8, device=device)

    def send(tensor: torch.Tensor, peer: int) -> None:
        if fabric is not None:
            delay = fabric.due(peer, tensor.numel(), time.monotonic()) - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        dist.send(tensor, peers[peer], group)

    def receive(tensor: torch.Tensor, peer: int) -> None:
        dist.recv(tensor, peers[peer], group)

    def answered(tensor: torch.Tensor, peer: int) -> float:
        """Seconds from sending ``tensor`` to ``peer`` to its one-element answer."""
        started = time.perf_counter()
        send(tensor, peer)
        receive(token, peer)
        if device.type == "cuda":  # NCCL's transfers are asynchronous to the host: wait for them
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    mine: dict[int, tuple[float, float]] = {}  # peer -> (latency s, bandwidth bytes/s), as sender
    for a in range(world):
        for b in range(world):
            if a == b or rank not in (a, b):
                continue
            if rank == b:
                for _ in range(repeats):
                    receive(token, a)
                    send(token, a)
                for _ in range(repeats):
                    receive(payload, a)
                    send(token, a)
                continue
            round_trip = min(answered(token, b) for _ in range(repeats))
            transfer = min(answered(payload, b) for _ in range(repeats))
            # less a round trip, but never under half the transfer: on a fast link the two are
            # close, and noise in either would make the difference, and the bandwidth, absurd
            mine[b] = (round_trip / 2, nbytes / max(transfer - round_trip, transfer / 2))
    everyone: list[dict[int, tuple[float, float]] | None] = [None] * world
    dist.all_gather_object(everyone, mine, group=group)
    links = tuple(
        Link(src, dst, bandwidth, latency)
        for src, measured in enumerate(everyone)
        for dst, (latency, bandwidth) in sorted((measured or {}).items())
    )
    return Topology(tuple(f"rank{r}" for r in range(world)), links)
