"""Runs a validated ``Program`` on a tensor over ``torch.distributed`` point-to-point messages.

Each step follows the program's semantics (``program`` module): receives land in scratch buffers
(or straight in the tensor, for an overwrite of a chunk the step does not also send), sends carry
the tensor's values as they were when the step began, and the receives are applied once every
message of the step is done. Messages between two ranks match by order: each ``Executor`` numbers
the messages of each directed pair, across calls, and uses the number as the gloo tag; NCCL, which
ignores tags, matches by order, and the steps' ops go out together (``batch_isend_irecv``, one NCCL
group) so that a cycle of sends within a step cannot deadlock. Empty chunks send nothing, on both
ends alike. The result is in place, as ``dist.all_reduce``: every rank's tensor for all_reduce
and broadcast, the root's for reduce (other ranks' tensors are left with partial sums: only the
root's result is defined, as with ``dist.reduce``).

Device-aware like ``comm``: messages live on the group's wire device (the current GPU under NCCL,
the CPU under gloo); a tensor elsewhere is copied there and back. With a ``PacedFabric`` (gloo
only: its sends go out one by one as the emulated links free up) receives are posted at once and
each send when its link delivers it.

Invariant: ``run`` returns only when this rank's part of the program is done, its tensor holding
the collective's result (for its role); every wait is bounded by ``timeout_s``.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from cloud.training.collectives.fabric import PacedFabric
from cloud.training.collectives.program import Program, Recv, Send

_TAG_SPACE = 2**30  # gloo tags are 32-bit; a pair's sequence wraps long after any message is pending


def group_wire_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where the group's messages must live: a CUDA device under NCCL, the CPU otherwise."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Executor:
    """Runs programs for this rank on one process group (program ranks = group ranks)."""

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        fabric: PacedFabric | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.device = group_wire_device(group)
        if fabric is not None and self.device.type != "cpu":
            raise ValueError("an emulated fabric paces gloo's sends only (NCCL batches a step's messages)")
        self.fabric = fabric
        self.timeout = timedelta(seconds=timeout_s)
        self._sent: dict[int, int] = {}  # peer -> messages sent to it so far
        self._received: dict[int, int] = {}  # peer -> messages received from it so far
        self._peers = [dist.get_global_rank(group, r) if group is not None else r for r in range(self.world)]
        self.calls = 0
        self.bytes_sent = 0

    def run(self, program: Program, tensor: torch.Tensor) -> torch.Tensor:
        """Run this rank's steps of ``program`` on ``tensor`` in place; returns ``tensor``."""
        if program.world != self.world:
            raise ValueError(f"program is for {program.world} ranks, the group has {self.world}")
        if not tensor.is_contiguous():
            raise ValueError("the tensor must be contiguous (its flat view is what the chunks index)")
        if tensor.numel() != program.numel:
            raise ValueError(f"program was built for {program.numel} elements, tensor has {tensor.numel()}")
        flat = tensor.view(-1)
        wire = flat if flat.device == self.device else flat.to(self.device)
        for step in program.steps[self.rank]:
            self._step(program, wire, step)
        if wire is not flat:
            flat.copy_(wire)
        self.calls += 1
        return tensor

    def _step(self, program: Program, flat: torch.Tensor, step: tuple[Send | Recv, ...]) -> None:
        started = time.monotonic()
        sent_chunks = {op.chunk for op in step if isinstance(op, Send)}
        receives: list[tuple[Recv, torch.Tensor, torch.Tensor]] = []  # op, local view, landing buffer
        recv_ops: list[dist.P2POp] = []
        sends: list[tuple[int, torch.Tensor]] = []  # peer, values
        for op in step:
            chunk = program.chunks[op.chunk]
            if chunk.numel == 0:
                continue  # both ends skip it: it is not numbered either
            view = flat[chunk.start : chunk.stop]
            if isinstance(op, Send):
                sends.append((op.peer, view))
                continue
            direct = not op.reduce and op.chunk not in sent_chunks
            buffer = view if direct else torch.empty_like(view)
            receives.append((op, view, buffer))
            recv_ops.append(
                dist.P2POp(dist.irecv, buffer, self._peers[op.peer], self.group, self._tag(op.peer, False))
            )
        send_ops = [
            dist.P2POp(dist.isend, v, self._peers[p], self.group, self._tag(p, True)) for p, v in sends
        ]
        self.bytes_sent += sum(v.numel() * v.element_size() for _, v in sends)
        if self.fabric is None:
            works = dist.batch_isend_irecv(recv_ops + send_ops) if recv_ops or send_ops else []
        else:
            works = self._paced(recv_ops, send_ops, sends, started)
        for work in works:
            work.wait(self.timeout)
        for op, view, buffer in receives:
            if op.reduce:
                view.add_(buffer)
            elif buffer is not view:
                view.copy_(buffer)

    def _paced(
        self,
        recv_ops: list[dist.P2POp],
        send_ops: list[dist.P2POp],
        sends: list[tuple[int, torch.Tensor]],
        started: float,
    ) -> list[dist.Work]:
        """Post the receives, then each send when its emulated link delivers it."""
        assert self.fabric is not None
        works = [_post(op) for op in recv_ops]
        due = [self.fabric.due(peer, v.numel() * v.element_size(), started) for peer, v in sends]
        for when, op in sorted(zip(due, send_ops, strict=True), key=lambda pair: pair[0]):
            delay = when - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            works.append(_post(op))
        return works

    def _tag(self, peer: int, sending: bool) -> int:
        counters = self._sent if sending else self._received
        sequence = counters.get(peer, 0)
        counters[peer] = sequence + 1
        return sequence % _TAG_SPACE


def _post(op: dist.P2POp) -> dist.Work:
    work = op.op(op.tensor, op.peer, op.group, op.tag)
    assert work is not None
    return work
