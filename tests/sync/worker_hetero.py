"""Scenario (c): rank 1 runs at half speed (it stays busy twice as long as its compute takes);
compute is measured in thread CPU time times the slowdown, so other jobs on the box do not move it;
the balancer evens out the ranks' compute times, and the parameters equal one process taking the
whole global batch each step."""

from __future__ import annotations

import copy
import statistics
import time

import torch
from _common import init, write_result
from torch import nn

from cloud.training.sync.balancer import Balancer, weighted_allreduce

STEPS, GLOBAL_BATCH, LR, WIDTH = 64, 128, 0.05, 512
SLOWDOWN = {1: 2.0}  # rank -> factor: a node of an older generation


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    # float64 so that "equals the single-process update" can be checked tightly: only the order of
    # the additions differs, and in float64 that stays far below the 1e-9 the test allows
    layers = [nn.Linear(64, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10)]
    return nn.Sequential(*layers).double()


def main() -> None:
    rank, _ = init()
    generator = torch.Generator().manual_seed(7)  # same global batches on every rank
    data = [
        (
            torch.randn(GLOBAL_BATCH, 64, generator=generator, dtype=torch.float64),
            torch.randint(0, 10, (GLOBAL_BATCH,), generator=generator),
        )
        for _ in range(STEPS)
    ]
    initial = make_model()
    model = copy.deepcopy(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    balancer = Balancer(GLOBAL_BATCH, every=2, alpha=0.3, hysteresis=0.04)  # residual well inside 10%
    loss_fn = nn.CrossEntropyLoss()
    compute_times, wall_times, sizes = [], [], []
    for x, y in data:
        part = balancer.my_slice()
        started, started_cpu = time.perf_counter(), time.thread_time()
        optimizer.zero_grad()
        loss_fn(model(x[part]), y[part]).backward()
        # The box's 2 cores are shared with other jobs, so wall time swings with their load; the
        # rank's own cost is measured in thread CPU time, and the injected slowdown scales that.
        busy = time.thread_time() - started_cpu
        factor = SLOWDOWN.get(rank, 1.0)
        time.sleep(busy * (factor - 1.0))  # injected: this rank is slower per sample
        compute = busy * factor
        balancer.record(part.stop - part.start, compute)
        compute_times.append(compute)
        wall_times.append(time.perf_counter() - started)
        sizes.append(balancer.local_size)
        weighted_allreduce(model.parameters(), balancer.weight)
        optimizer.step()
        balancer.end_iteration()

    reference = copy.deepcopy(initial)  # one process, the whole global batch, the same SGD
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)
    for x, y in data:
        ref_optimizer.zero_grad()
        loss_fn(reference(x), y).backward()
        ref_optimizer.step()
    diff = max(
        float((a - b).detach().abs().max())
        for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    )
    tail = compute_times[-24:]
    write_result(
        {
            "rank": rank,
            "sizes": sizes,
            "median_compute_s_tail": statistics.median(tail),
            "mean_compute_s_tail": statistics.mean(tail),
            "median_wall_s_tail": statistics.median(wall_times[-24:]),
            "max_abs_diff_vs_single": diff,
            "decisions": balancer.decisions,
        }
    )


if __name__ == "__main__":
    main()
