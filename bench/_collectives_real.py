"""Real all-reduces on 4 ranks over an emulated asymmetric fabric: our packed trees vs our ring vs
torch.distributed's all-reduce; ``measure_real`` is what ``bench.collectives`` calls.

The fabric (``asymmetric_fabric``) is a fragmented allocation: ranks 0-1-2 are joined by fast
links both ways, rank 3 has one fast link (to 2) and slow ones to 0 and 1, so every ring crosses a
slow hop, while spanning trees can hang rank 3 off rank 2 and spread the rest over the fast
triangle. The links are emulated by ``collectives.fabric.PacedFabric`` on the sending side of
gloo over loopback (docs/collectives.md, "Running"); it is declared as a ``Topology``, and
the programs come from ``reducer.all_reduce_builder``, so the simulator can predict each run
from ``topology`` and the sizes alone.

Systems, interleaved in each repetition so a change in the box's load hits every one:
- ``trees``: Blink's packed trees (``all_reduce_builder("trees")``) on the paced fabric;
- ``ring``: the best ring (``all_reduce_builder("ring")``) on the same paced fabric;
- ``torch``: ``dist.all_reduce`` (gloo's own algorithm) on loopback, *not* paced: a reference for
  what the transport itself costs, not a competitor on the fabric.
Each run's time is the slowest rank's (a barrier first). Every result is checked against
``dist.all_reduce``'s (integer-valued float32: bit-identical). ``real_vs_ring_asym`` = ring time
/ trees time at the largest size (median over repetitions; target >= 1.3).

    python -m bench._collectives_real [--quick]    (prints the dict; bench.collectives writes it)
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from bench._common import parser
from bench._torchrun import launch, leave_together, write_rank_result
from cloud.training.collectives.execute import Executor
from cloud.training.collectives.fabric import PacedFabric
from cloud.training.collectives.reducer import ProgramAllReduce, all_reduce_builder
from cloud.training.collectives.topology import Link, Topology

WORLD = 4
FAST, SLOW, LATENCY = 100e6, 12.5e6, 1e-3  # bytes/s, bytes/s, s per message
QUICK_SIZES = (1 << 18, 1 << 20, 1 << 22)  # elements (float32): 1, 4, 16 MB
FULL_SIZES = (1 << 18, 1 << 20, 1 << 22, 1 << 24)  # ... and 64 MB
SYSTEMS = ("trees", "ring", "torch")


def asymmetric_fabric(fast: float = FAST, slow: float = SLOW, latency: float = LATENCY) -> Topology:
    """4 ranks: 0-1, 0-2, 1-2, 2-3 fast, 0-3 and 1-3 slow, each link both ways."""
    speeds = {(0, 1): fast, (0, 2): fast, (1, 2): fast, (2, 3): fast, (0, 3): slow, (1, 3): slow}
    links = tuple(
        Link(src, dst, bandwidth, latency)
        for (a, b), bandwidth in speeds.items()
        for src, dst in ((a, b), (b, a))
    )
    return Topology(tuple(f"gpu{r}" for r in range(WORLD)), links)


def _timed(run: Callable[[torch.Tensor], object], tensor: torch.Tensor) -> float:
    dist.barrier()
    started = time.perf_counter()
    run(tensor)
    elapsed = torch.tensor(time.perf_counter() - started, dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the time
    return float(elapsed)


def worker(quick: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    topology = asymmetric_fabric()
    fabric = PacedFabric(topology, rank)  # one per process: both programs share the links
    ours = {
        name: ProgramAllReduce(all_reduce_builder(name, topology), Executor(None, fabric))
        for name in ("trees", "ring")
    }
    runs: dict[str, Callable[[torch.Tensor], object]] = {**ours, "torch": dist.all_reduce}
    sizes, repetitions = (QUICK_SIZES, 3) if quick else (FULL_SIZES, 5)
    times: dict[str, dict[str, list[float]]] = {name: {} for name in SYSTEMS}
    chunks: dict[str, int] = {}
    mismatches = 0
    for numel in sizes:
        data = torch.randint(-1000, 1000, (numel,), generator=torch.Generator().manual_seed(rank)).float()
        expected = data.clone()
        dist.all_reduce(expected)
        for name, reducer in ours.items():
            chunks[f"{name}/{numel}"] = len(reducer.program(numel).chunks)
        for _ in range(repetitions):
            for name in SYSTEMS:
                tensor = data.clone()
                times[name].setdefault(str(numel), []).append(_timed(runs[name], tensor))
                mismatches += int(not torch.equal(tensor, expected))
    if rank == 0:
        write_rank_result(
            {"times": times, "sizes": list(sizes), "chunks": chunks, "mismatches": mismatches}, 0
        )
    leave_together()


def measure_real(quick: bool) -> dict:
    """Times per system and size (seconds, per repetition), the topology (``Topology.to_dict``),
    the programs' builder names (``bench.collectives`` simulates the same programs on the same
    topology), ``real_vs_ring_asym`` and ``real_vs_torch_unpaced``."""
    figures = launch("bench._collectives_real", ["--quick"] if quick else [], nproc=WORLD, timeout_s=600)
    largest = str(figures["sizes"][-1])
    median = {
        name: {size: statistics.median(v) for size, v in figures["times"][name].items()} for name in SYSTEMS
    }
    return {
        "topology": asymmetric_fabric().to_dict(),
        "world": WORLD,
        "elem_bytes": 4,
        "sizes_elems": figures["sizes"],
        "builders": {
            "trees": 'reducer.all_reduce_builder("trees", topology)',
            "ring": 'all_reduce_builder("ring", topology)',
        },
        "times_s": figures["times"],
        "median_s": median,
        "chunks": figures["chunks"],
        "mismatches": figures["mismatches"],
        "real_vs_ring_asym": median["ring"][largest] / median["trees"][largest],
        "real_vs_torch_unpaced": median["torch"][largest] / median["trees"][largest],
    }


def main() -> None:
    options = parser(__doc__)
    options.add_argument("--worker", action="store_true")
    args = options.parse_args()
    if args.worker:
        worker(args.quick)
    else:
        print(json.dumps(measure_real(args.quick), indent=1))


if __name__ == "__main__":
    main()
