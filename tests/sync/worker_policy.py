"""Scenario (b): a delay injected on one layer's sync (rank 1 only) changes the policy; removing
it makes the policy go back. Writes the decision log and per-window tables as the result.

The engine judges measured times. On a shared 2-core box the measurements carry 10-50 ms of noise
(rank skew, a busy neighbour), which would move decisions at the engine's default thresholds of a few
ms. Here every threshold the engine decides by is a third of the injected delay: noise stays below
them and the delay stays above, so the decisions follow the delay and nothing else.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from cloud.training.sync.link import LinkDelay
from cloud.training.sync.rules import EngineConfig
from cloud.training.sync.scheduler import SyncScheduler
from tests.harness.torchrun import init_worker, write_result

WIDTH = int(os.environ.get("SYNC_TEST_WIDTH", "256"))
DEPTH = int(os.environ.get("SYNC_TEST_DEPTH", "4"))
BATCH = int(os.environ.get("SYNC_TEST_BATCH", "64"))
DELAY_S = float(os.environ.get("SYNC_TEST_DELAY_S", "0.15"))
WINDOW = 3
PHASES = (("before", 2), ("delayed", 6), ("removed", 8))  # (name, windows)


def main() -> None:
    rank, _ = init_worker()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(WIDTH, 10))
    delayed_layer = os.environ.get("SYNC_TEST_LAYER", str(2 * DEPTH))
    # merges and the planner off: this test is about the remedy for one slow sync, not about fusion
    noise_s = DELAY_S / 3
    engine = EngineConfig(
        merge_bytes=0,
        plan=False,
        block_threshold_s=noise_s,  # blocked less than this: not worth a trial
        heavy_min_s=noise_s,  # a sync shorter than this is not heavy
        backlog_min_s=noise_s,  # queued less than this: no backlog
        keep_abs_tol_s=noise_s,  # a trial is reverted only if it made things worse by more than this
    )
    sync = SyncScheduler(
        model, lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9), window=WINDOW, engine=engine
    )
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, WIDTH, generator=generator)
    y = torch.randint(0, 10, (BATCH,), generator=generator)
    loss_fn = nn.CrossEntropyLoss()
    phase_of_window = []
    for phase, windows in PHASES:
        delay = {delayed_layer: DELAY_S} if phase == "delayed" and rank == 1 else {}
        sync.link = LinkDelay(per_layer_s=delay)
        for _ in range(windows * WINDOW):
            loss_fn(model(x), y).backward()
        phase_of_window += [phase] * windows
    sync.close()
    write_result(
        {
            "delayed_layer": delayed_layer,
            "phases": phase_of_window,
            "tables": [t.as_dict() for t in sync.tables],
            "decisions": sync.engine.decisions,
            "final_policy": sync.policy.text(),
        }
    )


if __name__ == "__main__":
    main()
