"""Heterogeneous ranks: one rank 2x slower; iteration time with the uniform split vs balanced.

Two ranks under torchrun (gloo). Rank 1 is made a half-speed node by injection: after its
forward/backward it stays busy (sleeps) as long again, measured in its thread CPU time so that
other jobs on the shared box do not compound the slowdown; ranks report that cost to the
balancer. Baseline (same run): each rank takes half the global batch. Ours: ``Balancer`` (fixed +
per-sample cost fit, EWMA, hysteresis, damped re-split) with the sample-weighted all-reduce.
Figure: median wall time per iteration after warm-up (slowest rank), best of ROUNDS interleaved
runs per system. Ratios uniform time / balanced time (higher is better; 1.5 is the ceiling for a 2x
slower rank, reached only when nothing but the split compute costs time).

Two workloads, global batch 1024 each:
- ``cnn`` (headline, ``vs_uniform``): the digits CNN, 36k parameters, compute-bound, as the
  trainer's data-parallel jobs are;
- ``mlp`` (``vs_uniform_mlp``): 64-512-512-10, 300k parameters: the per-iteration cost no split
  can balance away (all-reduce of 1.2 MB, barrier, optimizer step: ~1.5 ms of ~15 ms) caps it
  near 1.43 on an idle box.

    python -m bench.hetero [--quick]   -> bench/results/hetero.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from bench._common import Results
from bench._torchrun import launch, leave_together, write_rank_result
from cloud.training.sync.balancer import Balancer, weighted_allreduce
from models.digits import digits_cnn

WIDTH, GLOBAL_BATCH = 512, 1024
ROUNDS = 3  # interleaved runs per system; the best of each counts
WORKLOADS = ("cnn", "mlp")


def make_workload(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """(model, inputs, labels) of one global batch; the same on every rank."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    if name == "cnn":
        model, x = digits_cnn(), torch.randn(GLOBAL_BATCH, 1, 8, 8, generator=generator)
    else:
        model = nn.Sequential(
            nn.Linear(64, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10)
        )
        x = torch.randn(GLOBAL_BATCH, 64, generator=generator)
    return model, x, torch.randint(0, 10, (GLOBAL_BATCH,), generator=generator)


def train(workload: str, balanced: bool, steps: int, warmup: int) -> tuple[float, list[int]]:
    rank = dist.get_rank()
    model, x, y = make_workload(workload)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    balancer = Balancer(GLOBAL_BATCH, every=2, alpha=0.3, hysteresis=0.1 if balanced else float("inf"))
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for _ in range(steps):
        dist.barrier()
        started, started_cpu = time.perf_counter(), time.thread_time()
        part = balancer.my_slice()
        optimizer.zero_grad()
        loss_fn(model(x[part]), y[part]).backward()
        busy = time.thread_time() - started_cpu  # CPU time: other jobs on the box do not inflate it
        if rank == 1:
            time.sleep(busy)  # injected: half-speed node
        balancer.record(part.stop - part.start, busy * (2.0 if rank == 1 else 1.0))
        weighted_allreduce(model.parameters(), balancer.weight)
        optimizer.step()
        balancer.end_iteration()
        times.append(time.perf_counter() - started)
    slowest = torch.tensor(statistics.median(times[warmup:]))
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest), list(balancer.sizes)


def worker(quick: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    steps, warmup = (40, 16) if quick else (80, 30)
    figures = {}
    for workload in WORKLOADS:
        uniform, balanced = [], []
        for _ in range(ROUNDS):  # interleaved, so a change in the box's background load hits both
            uniform.append(train(workload, False, steps, warmup))
            balanced.append(train(workload, True, steps, warmup))
        (uniform_s, _), (balanced_s, sizes) = min(uniform), min(balanced)
        figures[workload] = {"uniform_s": uniform_s, "balanced_s": balanced_s, "balanced_sizes": sizes}
    if dist.get_rank() == 0:
        write_rank_result({"workloads": figures, "steps": steps, "warmup": warmup}, 0)
    leave_together()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args.quick)
        return
    figures = launch("bench.hetero", ["--quick"] if args.quick else [])
    results = Results("hetero", args.quick)
    for workload, measured in figures["workloads"].items():
        case = f"{workload}, global batch {GLOBAL_BATCH}, rank1 at 1/2 speed"
        results.add(case, "uniform_split", "iteration_ms", measured["uniform_s"] * 1e3)
        results.add(case, "balanced", "iteration_ms", measured["balanced_s"] * 1e3)
        results.add(case, "balanced", "final_rank0_batch", measured["balanced_sizes"][0])
        results.add(case, "balanced", "final_rank1_batch", measured["balanced_sizes"][1])
        name = "vs_uniform" if workload == "cnn" else f"vs_uniform_{workload}"
        results.ratio(name, measured["uniform_s"], measured["balanced_s"])
    results.write()


if __name__ == "__main__":
    main()
