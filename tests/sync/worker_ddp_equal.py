"""Scenario (a): the sync scheduler under several policies ends at DDP's parameters."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cloud.training.sync.rules import EngineConfig
from cloud.training.sync.scheduler import SyncScheduler
from tests.harness.torchrun import init_worker, write_result

STEPS, BATCH, LR = 12, 8, 0.1


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(100 + rank)
    return [
        (torch.randn(BATCH, 8, generator=generator), torch.randint(0, 4, (BATCH,), generator=generator))
        for _ in range(STEPS)
    ]


def main() -> None:
    rank, _ = init_worker()
    data = batches(rank)
    loss_fn = nn.CrossEntropyLoss()
    initial = make_model()

    reference = copy.deepcopy(initial)
    ddp = DistributedDataParallel(reference)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    for x, y in data:
        optimizer.zero_grad()
        loss_fn(ddp(x), y).backward()
        optimizer.step()

    group = dist.new_group(backend="gloo")
    configs = {
        "default": {},
        "merged_held": {"policy": "4+2|0 held=0", "adaptive": False},
        "adaptive_switching": {
            "engine": EngineConfig(block_threshold_s=0.0, merge_bytes=1 << 30, plan=False, keep_rel_tol=10.0),
            "window": 2,
        },
    }
    result = {}
    for label, options in configs.items():
        model = copy.deepcopy(initial)
        sync = SyncScheduler(
            model, lambda params: torch.optim.SGD(params, lr=LR, momentum=0.9), group=group, **options
        )
        for x, y in data:
            loss_fn(model(x), y).backward()
        sync.close()
        pairs = zip(model.parameters(), reference.parameters(), strict=True)
        diff = max(float((a - b).detach().abs().max()) for a, b in pairs)
        policies = [t.policy for t in sync.tables] + [sync.policy.text()]
        result[label] = {"max_abs_diff": diff, "policies": policies}
    write_result(result)


if __name__ == "__main__":
    main()
