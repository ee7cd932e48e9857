"""Where a training rank computes and how the ranks talk: the job's ``[train] device`` and the
rank's ``LOCAL_RANK`` resolved to a torch device and a ``torch.distributed`` backend.

The rules (docs/training.md, "Devices"):
- ``"cpu"``: CPU tensors, gloo.
- ``"cuda"``: the rank computes on ``cuda:<local_rank % gpus>``. NCCL when every rank on the node
  has a GPU of its own (NCCL refuses two ranks on one GPU); gloo otherwise, and then the transport
  moves each message through CPU memory (``comm.wire_device``). No CUDA at all: ``DeviceUnavailable``,
  whose one-line message names the field.
- ``"auto"``: ``"cuda"`` when this torch sees a GPU, else ``"cpu"``.

Invariant: ``resolve`` is a pure function of its arguments (the tests table it); ``placement_for``
only adds what it reads from the environment and from torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cloud.training.options import DeviceChoice


class DeviceUnavailable(ValueError):
    """The job asks for a device this machine does not have; the message names ``train.device``."""


@dataclass(frozen=True)
class Placement:
    device: torch.device  # where the rank's model, optimizer state and inputs live
    backend: str  # "nccl" or "gloo"

    def describe(self) -> str:
        return f"device {self.device}, backend {self.backend}"


def resolve(
    choice: DeviceChoice,
    *,
    local_rank: int,
    local_world: int,
    gpus: int,
    nccl: bool = True,
    cuda_build: bool = True,
) -> Placement:
    """The rank's placement. ``gpus``: CUDA devices this process sees; ``nccl``: torch has NCCL;
    ``cuda_build``: torch was built with CUDA (only to say why there is no GPU)."""
    if choice == "cpu" or (choice == "auto" and gpus == 0):
        return Placement(torch.device("cpu"), "gloo")
    if gpus == 0:
        why = "this torch build has no CUDA" if not cuda_build else "torch sees no CUDA device"
        raise DeviceUnavailable(f'train.device: "cuda" but {why} on this machine; use "auto" or "cpu"')
    device = torch.device("cuda", local_rank % gpus)
    own_gpu = local_world <= gpus  # NCCL: "Duplicate GPU detected" when two ranks share one
    return Placement(device, "nccl" if nccl and own_gpu else "gloo")


def placement_for(choice: DeviceChoice) -> Placement:
    """This process's placement, from torchrun's ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (0 / 1 when
    run without torchrun) and what torch sees."""
    return resolve(
        choice,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0,
        nccl=dist.is_nccl_available(),
        cuda_build=torch.version.cuda is not None,
    )


def activate(placement: Placement) -> None:
    """Make the placement's GPU this process's current one (before the process group starts), so
    that NCCL collectives and ``*_object`` collectives use it."""
    if placement.device.type == "cuda":
        torch.cuda.set_device(placement.device)
