"""Scenario (c): rank 1 runs at half speed; the balancer evens out the ranks' compute times, and the
parameters equal one process taking the whole global batch each step.

A rank's compute time is modelled, not measured: an iteration costs COST_S (fixed + per sample) on a
full-speed rank and SLOWDOWN times that on a slow one, and the rank takes at least that long (it
sleeps out what its real forward and backward did not use). Measured times swing with whatever else
runs on the box (thread CPU time too, by 10% and more on 2 shared cores); with a modelled cost the
balancer's input, and so its split, is the same on every run, and the test judges the balancer, not
the box. The gradients and the update are real.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
from torch import nn

from cloud.training.sync.balancer import Balancer, weighted_allreduce
from tests.harness.torchrun import init_worker, write_result

STEPS, GLOBAL_BATCH, LR, WIDTH = 64, 128, 0.05, 512
SLOWDOWN = {1: 2.0}  # rank -> factor: a node of an older generation
COST_S = (0.002, 0.0001)  # a full-speed rank's iteration: fixed seconds, seconds per sample


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    # float64 so that "equals the single-process update" can be checked tightly: only the order of
    # the additions differs, and in float64 that stays far below the 1e-9 the test allows
    layers = [nn.Linear(64, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10)]
    return nn.Sequential(*layers).double()


def main() -> None:
    rank, _ = init_worker()
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
        samples = part.stop - part.start
        started = time.perf_counter()
        optimizer.zero_grad()
        loss_fn(model(x[part]), y[part]).backward()
        fixed_s, per_sample_s = COST_S
        compute = (fixed_s + per_sample_s * samples) * SLOWDOWN.get(rank, 1.0)
        time.sleep(max(0.0, compute - (time.perf_counter() - started)))  # the rank takes its modelled time
        balancer.record(samples, compute)
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
