"""A job's gradient all-reduce as a program (``sync.collective``): built per tensor size from the
fabric, validated once, cached, and run by an ``Executor`` on the caller's process group.

``all_reduce_builder`` is the one place a collective's name becomes a builder: "ring" is the ring
whose slowest hop is fastest (NCCL's choice of one ring), "trees" Blink's trees packed into the
fabric at their best root, "double_tree" NCCL's double binary tree. Pipeline chunks follow the
packing's cost model, but never below ``MIN_CHUNK_BYTES``: each message also costs the transport a
hand-shake the fabric's latency may not show. Benchmarks build their programs here too, so what the
simulator predicts is what ran.

A group's fabric is the job's ``Topology`` restricted to the group's ranks (``Topology.subset``,
renumbered in group order); without a topology file every pair of ranks is alike (``uniform``).

Invariant: a program runs only after ``validate`` accepted it for that size; the cache holds at
most ``max_programs`` sizes (least recently used out first; ``evicted`` counts them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Literal

import torch
import torch.distributed as dist

from cloud.training.collectives.execute import Executor
from cloud.training.collectives.fabric import PacedFabric
from cloud.training.collectives.packing import best_root
from cloud.training.collectives.plans import (
    best_ring,
    double_binary_tree_all_reduce,
    packed_program,
    packing_chunk,
    ring_all_reduce,
)
from cloud.training.collectives.program import Program, validate
from cloud.training.collectives.topology import Link, Topology

ProgramCollective = Literal["ring", "trees", "double_tree"]
MIN_CHUNK_BYTES = 256 * 1024
UNIFORM_BANDWIDTH = 1e9  # bytes/s: the uniform fabric's links (only their equality matters to a plan)
UNIFORM_LATENCY = 50e-6  # s: a loopback message's hand-shake, for the chunk cost model


def uniform(world: int) -> Topology:
    """Every ordered pair of ``world`` ranks joined by the same link."""
    links = tuple(
        Link(a, b, UNIFORM_BANDWIDTH, UNIFORM_LATENCY) for a in range(world) for b in range(world) if a != b
    )
    return Topology(tuple(f"rank{r}" for r in range(world)), links)


def all_reduce_builder(
    collective: ProgramCollective, topology: Topology, elem_bytes: int = 4
) -> Callable[[int], Program]:
    """numel -> the all-reduce program of ``collective`` on ``topology``."""
    world = topology.world
    min_chunk = max(1, MIN_CHUNK_BYTES // elem_bytes)
    if collective == "ring":
        order = best_ring(topology)
        return lambda numel: ring_all_reduce(world, numel, order)
    if collective == "double_tree":
        return lambda numel: double_binary_tree_all_reduce(world, numel, max(min_chunk, numel // 8))
    if collective == "trees":
        packing = best_root(topology, "all_reduce")

        def build(numel: int) -> Program:
            chunk = max(min_chunk, packing_chunk(topology, packing, numel, elem_bytes))
            return packed_program(topology, "all_reduce", numel, chunk=chunk, packing=packing)

        return build
    raise ValueError(f"collective {collective!r} is not one of ring, trees, double_tree")


class ProgramAllReduce:
    """Sums a tensor over the executor's group in place with programs from ``build``."""

    def __init__(self, build: Callable[[int], Program], executor: Executor, max_programs: int = 16) -> None:
        self.build = build
        self.executor = executor
        self.max_programs = max_programs
        self._programs: OrderedDict[int, Program] = OrderedDict()
        self.evicted = 0

    def program(self, numel: int) -> Program:
        program = self._programs.get(numel)
        if program is None:
            program = self.build(numel)
            validate(program, numel)
            self._programs[numel] = program
            if len(self._programs) > self.max_programs:
                self._programs.popitem(last=False)
                self.evicted += 1
        self._programs.move_to_end(numel)
        return program

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.executor.run(self.program(tensor.numel()), tensor)


def reducer_factory(
    collective: ProgramCollective,
    topology: Topology | None,
    *,
    emulate: bool = False,
    timeout_s: float = 300.0,
) -> Callable[[dist.ProcessGroup | None], ProgramAllReduce]:
    """group -> its all-reduce on ``topology`` (the job's ranks; None: uniform). ``emulate``: pace
    the sends on the topology's links (``fabric``), one ``PacedFabric`` per set of ranks, shared
    by the groups over them (a second lane adds no bandwidth)."""
    fabrics: dict[tuple[int, ...], PacedFabric] = {}

    def make(group: dist.ProcessGroup | None) -> ProgramAllReduce:
        ranks = tuple(
            dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())
        )
        if topology is not None and topology.world != dist.get_world_size():
            raise ValueError(f"the topology has {topology.world} ranks, the job {dist.get_world_size()}")
        fabric_of_group = topology.subset(ranks) if topology is not None else uniform(len(ranks))
        fabric = None
        if emulate:
            fabric = fabrics.setdefault(ranks, PacedFabric(fabric_of_group, dist.get_rank(group)))
        executor = Executor(group, fabric, timeout_s)
        return ProgramAllReduce(all_reduce_builder(collective, fabric_of_group), executor)

    return make
