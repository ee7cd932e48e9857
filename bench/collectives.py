"""Spanning-tree collectives (Blink) and reliability classes (RAIL): simulated, then real.

1. Fragmented DGX-1 allocations (simulated): every set of 3-7 of a DGX-1V's 8 GPUs a scheduler
   could hand out (``--quick``: 6 of each size, drawn with a fixed seed), a 64 MB all-reduce (16 MB
   in ``--quick``) of our packed trees (rooted at the allocation's first GPU, 4 trees at most) vs
   the ring whose slowest hop is fastest (NCCL's choice of one ring; one channel), both predicted
   by ``simulate`` on the allocation's ``fabrics.dgx1``;
   NCCL's double binary tree is shown beside them. ``sim_vs_ring_fragmented`` = the median over
   allocations of ring time / trees time (target >= 2).
2. RAIL (simulated): 8 machines of 4 GPUs, every machine pair joined by optics through 100 Gb/s
   NICs. The job mix: 2 class-A jobs (path loss <= 1e-6) and 2 class-C jobs (<= 1e-2), each on 2
   machines, 100 iterations of 50 ms compute + an all-reduce of its gradient (100 MB; 16 MB in
   ``--quick``) on trees packed into its class's admissible links. The all-reliable fabric has
   reliable optics everywhere; the mixed one only among the machines the class-A jobs need (4),
   cheap lossy optics elsewhere (loss 1e-4; cost 0.6 of reliable: an assumption, RAIL reports up
   to 44% lower network cost at 40 Gb/s). Jobs are placed strictest class first on the hosts
   ``reliability.admissible_nodes`` allows, and every placed job's trees are checked path by path
   against its class (``jobs_below_class``, must be 0); a class-blind placement on the mixed fabric
   is the contrast (it does put jobs below their class). ``rail_cost_saving`` = 1 - mixed cost /
   all-reliable cost, counted only if the mean job completion time on the mixed fabric is within
   1% of the all-reliable one (else 0; both JCTs are in the table).
3. Real (``bench._collectives_real.measure_real``, when present): 4 ranks under torchrun on an
   emulated asymmetric fabric; ``real_vs_ring_asym`` (target >= 1.3) from there, and
   ``sim_error_real``: |simulated - measured| / measured for the trees and the ring at the largest
   size, the larger of the two (target <= 0.2). The fabric's pacing runs over a real transport
   (gloo on loopback) whose own copy adds to each message, so the simulator is given that
   transport's rate (``simulate(transport_bps=)``), probed by torch's unpaced all-reduce in the same
   run (not by the runs it predicts); ``sim_error_real_links_only`` is the error without it. Every
   size's errors are in ``real.sim_errors``.

``rail_cost_saving`` (target >= 0.25), ``sim_error_real`` and ``sim_error_real_links_only`` (lower is
better) are not ours/baseline ratios; the others are.

    python -m bench.collectives [--quick]   -> bench/results/collectives.json
"""

from __future__ import annotations

import importlib.util
import random
import statistics
from typing import Any

from bench._common import Results, parse_args
from cloud.training.collectives import fabrics, plans
from cloud.training.collectives.packing import pack_trees
from cloud.training.collectives.reliability import (
    CLASSES,
    ClassViolation,
    ReliabilityClass,
    admissible_nodes,
    pack_for_class,
    worst_path_loss,
)
from cloud.training.collectives.simulate import simulate
from cloud.training.collectives.topology import Topology

CLASS = {c.name: c for c in CLASSES}
JOB_MIX = [("C", 2), ("A", 2), ("C", 2), ("A", 2)]  # (class, machines) per job, in arrival order
MACHINES, GPUS_PER_MACHINE = 8, 4
ITERATIONS, COMPUTE_S = 100, 0.05
SAME_JCT = 1.01


def fragmented(results: Results, quick: bool) -> None:
    allocations = fabrics.dgx1_allocations()
    if quick:
        draw = random.Random(0)
        allocations = [a for k in range(3, 8) for a in draw.sample(fabrics.dgx1_allocations([k]), 6)]
    numel = (16 if quick else 64) * 2**20 // 4
    ratios: list[float] = []
    by_size: dict[int, list[tuple[float, float, float]]] = {}
    for gpus in allocations:
        fabric = fabrics.dgx1(gpus)
        ring = simulate(plans.ring_all_reduce(len(gpus), numel, plans.best_ring(fabric)), fabric)
        packing = pack_trees(fabric, 0, "all_reduce")
        trees = simulate(plans.packed_program(fabric, "all_reduce", numel, packing=packing), fabric)
        chunk = max(1, numel // 16)
        double_tree = simulate(plans.double_binary_tree_all_reduce(len(gpus), numel, chunk), fabric)
        ratios.append(ring / trees)
        by_size.setdefault(len(gpus), []).append((ring, trees, double_tree))
    for size, runs in sorted(by_size.items()):
        case = f"dgx1 {size} GPUs, median of {len(runs)}"
        for index, system in enumerate(("ring", "trees", "double_binary_tree")):
            results.add(case, system, "all_reduce_ms", 1e3 * statistics.median(r[index] for r in runs))
    results.ratios["sim_vs_ring_fragmented"] = statistics.median(ratios)
    results.extra["fragmented"] = {
        "allocations": len(allocations),
        "bytes": numel * 4,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def place(fabric: Topology, by_class: bool) -> list[tuple[str, list[str]] | None]:
    """Hosts per job (None: could not be placed), strictest class first (or in order, class-blind)."""
    taken: set[str] = set()
    placed: list[tuple[str, list[str]] | None] = [None] * len(JOB_MIX)
    order = sorted(range(len(JOB_MIX)), key=lambda j: JOB_MIX[j][0]) if by_class else range(len(JOB_MIX))
    for job in order:
        name, machines = JOB_MIX[job]
        allowed = admissible_nodes(fabric, CLASS[name]) if by_class else set(fabric.hosts)
        free = sorted(allowed - taken)
        if len(free) >= machines:
            placed[job] = (name, free[:machines])
            taken.update(free[:machines])
    return placed


def run_jobs(fabric: Topology, by_class: bool, numel: int) -> dict[str, Any]:
    jcts, below = [], 0
    for job in place(fabric, by_class):
        if job is None:
            continue
        name, hosts = job
        job_class: ReliabilityClass = CLASS[name]
        allocation = fabric.subset([r for r in range(fabric.world) if fabric.hosts[r] in hosts])
        try:
            packing = pack_for_class(allocation, job_class) if by_class else pack_trees(allocation)
        except ClassViolation:
            below += 1
            continue
        below += int(worst_path_loss(allocation, packing) > job_class.max_path_loss)
        seconds = simulate(plans.packed_program(allocation, "all_reduce", numel, packing=packing), allocation)
        jcts.append(ITERATIONS * (COMPUTE_S + seconds))
    return {
        "cost": sum(link.cost for link in fabric.links),
        "placed": len(jcts),
        "jobs_below_class": below,
        "mean_jct_s": statistics.mean(jcts) if jcts else float("inf"),
    }


def rail(results: Results, quick: bool) -> None:
    numel = (16 if quick else 100) * 2**20 // 4
    island = range(sum(machines for name, machines in JOB_MIX if name == "A"))
    reliable = fabrics.mixed_reliability(MACHINES, GPUS_PER_MACHINE, [], all_reliable=True)
    mixed = fabrics.mixed_reliability(MACHINES, GPUS_PER_MACHINE, island)
    outcomes = {
        "all_reliable": run_jobs(reliable, True, numel),
        "mixed_rail": run_jobs(mixed, True, numel),
        "mixed_class_blind": run_jobs(mixed, False, numel),
    }
    for system, outcome in outcomes.items():
        for metric in ("cost", "mean_jct_s", "jobs_below_class", "placed"):
            results.add("rail 8x4, jobs 2A+2C", system, metric, outcome[metric])
    same_jct = outcomes["mixed_rail"]["mean_jct_s"] <= SAME_JCT * outcomes["all_reliable"]["mean_jct_s"]
    fits = (
        outcomes["mixed_rail"]["placed"] == len(JOB_MIX) and outcomes["mixed_rail"]["jobs_below_class"] == 0
    )
    saving = 1.0 - outcomes["mixed_rail"]["cost"] / outcomes["all_reliable"]["cost"]
    results.ratios["rail_cost_saving"] = saving if same_jct and fits else 0.0
    results.extra["rail"] = {
        "job_mix": [{"class": name, "machines": machines} for name, machines in JOB_MIX],
        "same_jct": same_jct,
        "all_placed_within_class": fits,
        **{system: outcome for system, outcome in outcomes.items()},
    }


def real(results: Results, quick: bool) -> None:
    if importlib.util.find_spec("bench._collectives_real") is None:
        print("real part missing: bench/_collectives_real.py is not there (real_vs_ring_asym not measured)")
        return
    from bench._collectives_real import measure_real
    from cloud.training.collectives.reducer import all_reduce_builder
    from cloud.training.collectives.topology import from_dict

    figures = measure_real(quick)
    topology = from_dict(figures["topology"])
    sizes, elem_bytes, world = figures["sizes_elems"], figures["elem_bytes"], figures["world"]
    largest = str(sizes[-1])
    # the transport's own rate, probed by torch's unpaced all-reduce at the largest size: the bytes
    # a rank passes through it in a ring all-reduce over that run's time
    transport_bps = 2 * (world - 1) / world * sizes[-1] * elem_bytes / figures["median_s"]["torch"][largest]
    errors: dict[str, dict[str, dict[str, float]]] = {"links_only": {}, "with_transport": {}}
    for system in ("trees", "ring"):
        build = all_reduce_builder(system, topology, elem_bytes)
        for size in sizes:
            measured = figures["median_s"][system][str(size)]
            results.add(_real_case(size), system, "measured_ms", 1e3 * measured)
            for model, rate in (("links_only", None), ("with_transport", transport_bps)):
                predicted = simulate(build(size), topology, elem_bytes, rate)
                errors[model].setdefault(system, {})[str(size)] = abs(predicted - measured) / measured
                results.add(_real_case(size), system, f"simulated_ms_{model}", 1e3 * predicted)
    for size in sizes:
        results.add(
            _real_case(size), "torch_unpaced", "measured_ms", 1e3 * figures["median_s"]["torch"][str(size)]
        )
    results.ratios["real_vs_ring_asym"] = figures["real_vs_ring_asym"]
    results.ratios["sim_error_real"] = max(errors["with_transport"][s][largest] for s in ("trees", "ring"))
    results.ratios["sim_error_real_links_only"] = max(
        errors["links_only"][s][largest] for s in ("trees", "ring")
    )
    results.extra["real"] = {**figures, "transport_bps": transport_bps, "sim_errors": errors}


def _real_case(numel: int) -> str:
    return f"real 4 ranks asym, {numel * 4 / 2**20:g} MB"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__ or "", argv)
    results = Results("collectives", args.quick)
    fragmented(results, args.quick)
    rail(results, args.quick)
    real(results, args.quick)
    results.write()


if __name__ == "__main__":
    main()
