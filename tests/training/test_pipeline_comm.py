"""The stage transport over a real gloo process group (2 processes): eager payload receives whose
capacity is learned per slot, with messages that shrink (padded to the receive), grow past it, and
change codec shape; on the default group and on the per-direction groups of ``comm.Channels``."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cloud.training import comm
from tests.harness.processes import free_port

# One slot (same tag every round), as a pipeline schedule repeats its messages every step: the first
# round has no capacity yet, the third outgrows it, the fourth is shorter than it, the last is empty.
SHAPES = [(4, 4), (4, 4), (16, 8), (2, 3), (16, 8), (0,)]


def _tensor(round_: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(round_)
    return torch.randn(SHAPES[round_], generator=generator)


def _exchange(rank: int, port: int, failures, own_groups: bool) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    try:
        sizes, tag = comm.SlotSizes(), comm.message_tag(comm.KIND_ACTIVATION, 3)
        channel = (comm.Channels.create([[0], [1]]) if own_groups else comm.Channels.default()).forward
        for round_ in range(len(SHAPES)):
            if rank == 0:
                sends = comm.PendingSends()
                comm.send_tensor(_tensor(round_), 1, tag, comm.Fp32Codec(), sends, sizes, channel)
                sends.wait_all(30)
            else:
                pending = comm.PendingRecv(0, tag, sizes, channel)
                expected_capacity = 0 if round_ == 0 else _tensor(round_ - 1).numel() * 4
                if pending.capacity != expected_capacity:
                    failures.put(f"round {round_}: capacity {pending.capacity} != {expected_capacity}")
                got = pending.wait(30)
                if not torch.equal(got, _tensor(round_)):
                    failures.put(f"round {round_}: received tensor differs")
            dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("own_groups", [False, True], ids=["default-group", "channels"])
def test_eager_payloads_survive_shrinking_and_growing_messages(own_groups):
    port = free_port()
    context = mp.get_context("spawn")
    failures = context.SimpleQueue()
    mp.start_processes(_exchange, args=(port, failures, own_groups), nprocs=2, start_method="spawn")
    problems = []
    while not failures.empty():
        problems.append(failures.get())
    assert problems == []
