"""The one executor: runs a rank's schedule actions for its pipeline stage (or stage replica).

``StageExecutor.run_step`` walks ``schedule.orders[rank]`` in order: ``RECV_*`` waits for a receive
posted at the start of the step (sized from the slot's last message, so transfers overlap
compute; see ``comm``), ``F``/``B`` compute, ``SEND_*`` posts an ``isend``. Backward uses
``torch.autograd.grad`` with explicit inputs, so gradients land only where the executor puts them.

On every stage but the first, a plain ``nn.Sequential`` stage without activation compression splits
its backward (``backward.py``): ``B`` computes the input gradient, ``SEND_B`` ships it, and the weight
gradients follow before the next action, so the previous stage stops waiting one weight-gradient pass
sooner. (With compression a split would decompress each saved activation twice.)

Weight updates follow ``schedule.update``:
- ``flush`` (GPipe, 1F1B-flush): gradients of all microbatches accumulate (each loss scaled by
  1/microbatches), replicas of a stage all-reduce them in their own process group, then one
  optimizer step: the same update as single-process training with gradient accumulation.
- ``per_microbatch`` (1F1B-stash, PipeDream): every backward is followed by an optimizer step.
  The forward of microbatch b runs on a snapshot of the weights (the newest version, or with
  vertical sync the version stage 0 used), and its backward differentiates that same snapshot:
  weight stashing. A snapshot is freed when no in-flight or future microbatch needs it.

Invariant: after ``run_step`` returns, no send or receive of the step is outstanding and no
microbatch state (activations, stashed weights) is left over.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from cloud.training import backward, comm
from cloud.training.schedules import Schedule, Topology


@dataclass
class StepStats:
    busy_s: float = 0.0  # compute: forward, backward, optimizer
    idle_s: float = 0.0  # waiting for receives, sends and the replica all-reduce
    loss_sum: float = 0.0  # last stage only: sum of unscaled microbatch losses
    n_losses: int = 0
    bytes_sent: int = 0
    wire_bytes_fp32: int = 0  # boundary tensors sent, at their uncompressed size
    wire_bytes_sent: int = 0  # the codec payloads actually sent for them


@dataclass
class _InFlight:
    inputs: torch.Tensor
    output: torch.Tensor  # stage output, or the scaled loss on the last stage
    params: dict[str, torch.Tensor] | None  # the stashed weight version (per_microbatch only)
    version: int
    tape: backward.LayerTape | None  # split backward: the layer outputs its weight pass needs


class StageExecutor:
    def __init__(
        self,
        module: nn.Sequential,
        topology: Topology,
        rank: int,
        *,
        optimizer: torch.optim.Optimizer | None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        codec: comm.WireCodec | None = None,
        replica_group: dist.ProcessGroup | None = None,
        timeout_s: float = 120.0,
        activation_context: Callable[[], AbstractContextManager] | None = None,
    ):
        self.module, self.topology, self.rank = module, topology, rank
        self.stage, self.replica = topology.stage_replica_of(rank)
        self.is_first, self.is_last = self.stage == 0, self.stage == topology.n_stages - 1
        self.optimizer, self.loss_fn = optimizer, loss_fn
        self.codec = codec or comm.Fp32Codec()
        self.replica_group, self.timeout_s = replica_group, timeout_s
        self.params = dict(module.named_parameters())
        self.split_backward = not self.is_first and activation_context is None and backward.splittable(module)
        self.slot_sizes = comm.SlotSizes()  # capacities of eager payload receives, per peer and tag
        # Entered around every training forward: e.g. ActivationCompressor.active, whose
        # saved-tensor hooks store what backward needs compressed.
        self.activation_context = activation_context or contextlib.nullcontext

    # -- weight versions (per_microbatch updates) -------------------------------------------------
    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone().requires_grad_(True) for name, p in self.params.items()}

    def _apply_update(self, grads: Sequence[torch.Tensor | None]) -> None:
        for p, g in zip(self.params.values(), grads, strict=True):
            p.grad = None if g is None else g.detach()
        self._optimizer_step()

    def _optimizer_step(self) -> None:
        if self.optimizer is not None:  # None: a stage without parameters (e.g. pool + flatten)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    # -- one step ---------------------------------------------------------------------------------
    def run_step(
        self,
        schedule: Schedule,
        inputs: dict[int, torch.Tensor] | None,
        targets: dict[int, torch.Tensor] | None,
    ) -> StepStats:
        """Run this rank's actions; ``inputs`` (stage 0) and ``targets`` (last stage) by microbatch."""
        if schedule.topology != self.topology:
            raise ValueError("schedule built for another topology")
        stashing = schedule.update == "per_microbatch"
        if stashing and max(self.topology.replicas) > 1:
            raise NotImplementedError("1f1b-stash with replicated stages")
        stats, sends = StepStats(), comm.PendingSends()
        order = schedule.orders[self.rank]
        recvs = self._post_receives(schedule)
        received: dict[tuple[str, int], torch.Tensor] = {}
        in_flight: dict[int, _InFlight] = {}
        input_grads: dict[int, torch.Tensor] = {}
        scale = 1.0 if stashing else 1.0 / schedule.n_microbatches
        tags = schedule.stash_versions() if schedule.vertical_sync else {}
        version, snapshots = 0, {}
        needed = Counter(tags[a.microbatch] for a in order if a.kind == "F") if tags else Counter()
        if stashing and (not tags or needed[0]):
            snapshots[0] = self._snapshot()
        deferred: tuple[_InFlight, list] | None = None  # a split backward's weight pass, still to run

        def apply_weight_grads(weight_grads: Sequence[torch.Tensor | None]) -> None:
            nonlocal version
            if stashing:
                self._apply_update(weight_grads)
                version += 1
                if not tags or needed[version]:
                    snapshots[version] = self._snapshot()
                self._drop_unused(snapshots, in_flight, needed, version if not tags else None)
            else:
                self._accumulate(weight_grads)

        def run_deferred() -> None:
            nonlocal deferred
            start = time.perf_counter()
            state, output_grads = deferred
            deferred = None
            apply_weight_grads(backward.weight_gradients(state.tape, output_grads))
            stats.busy_s += time.perf_counter() - start

        for action in order:
            for pending in recvs.values():
                pending.poll()
            if deferred is not None and action.kind != "SEND_B":
                run_deferred()
            b = action.microbatch
            start = time.perf_counter()
            if action.kind in ("RECV_F", "RECV_B"):
                received[(action.kind, b)] = recvs.pop((action.kind, b)).wait(self.timeout_s)
                stats.idle_s += time.perf_counter() - start
            elif action.kind == "SEND_F":
                comm.send_tensor(
                    in_flight[b].output.detach(),
                    self.topology.rank_for(self.stage + 1, b),
                    comm.message_tag(comm.KIND_ACTIVATION, b),
                    self.codec,
                    sends,
                    self.slot_sizes,
                )
            elif action.kind == "F":
                x = inputs[b] if self.is_first else received.pop(("RECV_F", b)).requires_grad_(True)
                use = tags.get(b, version) if stashing else version
                params = snapshots.get(use) if stashing else None
                if stashing and params is None:
                    raise RuntimeError(f"stage {self.stage}: weight version {use} of microbatch {b} not kept")
                tape = None
                with self.activation_context():
                    if self.split_backward:
                        tape = backward.LayerTape(self.module, x, params)
                        out = tape.output
                    elif params is not None:
                        out = functional_call(self.module, params, (x,))
                    else:
                        out = self.module(x)
                    loss = self.loss_fn(out, targets[b]) if self.is_last else None
                if self.is_last:
                    stats.loss_sum, stats.n_losses = stats.loss_sum + float(loss.detach()), stats.n_losses + 1
                    out = loss * scale
                in_flight[b] = _InFlight(x, out, params, use, tape)
                if tags:
                    needed[use] -= 1
                stats.busy_s += time.perf_counter() - start
            elif action.kind == "B":
                state = in_flight.pop(b)
                grad_out = None if self.is_last else received.pop(("RECV_B", b))
                if state.tape is not None:
                    input_grads[b], output_grads = backward.input_gradient(
                        state.tape, state.output, state.inputs, grad_out
                    )
                    deferred = (state, output_grads)
                else:
                    weights = list((state.params or self.params).values())
                    wrt = ([] if self.is_first else [state.inputs]) + weights
                    grads = torch.autograd.grad(state.output, wrt, grad_out, allow_unused=True) if wrt else ()
                    input_grad, weight_grads = (None, grads) if self.is_first else (grads[0], grads[1:])
                    apply_weight_grads(weight_grads)
                    if input_grad is not None:
                        input_grads[b] = input_grad
                stats.busy_s += time.perf_counter() - start
            elif action.kind == "SEND_B":
                comm.send_tensor(
                    input_grads.pop(b),
                    self.topology.rank_for(self.stage - 1, b),
                    comm.message_tag(comm.KIND_GRADIENT, b),
                    self.codec,
                    sends,
                    self.slot_sizes,
                )
        if deferred is not None:
            run_deferred()
        start = time.perf_counter()
        sends.wait_all(self.timeout_s)
        if in_flight or recvs:
            raise RuntimeError(f"rank {self.rank}: unfinished microbatches {sorted(in_flight)}")
        if not stashing:
            self._allreduce_grads()
            stats.idle_s += time.perf_counter() - start
            start = time.perf_counter()
            self._optimizer_step()
            stats.busy_s += time.perf_counter() - start
        else:
            stats.idle_s += time.perf_counter() - start
        stats.bytes_sent = sends.bytes_sent
        stats.wire_bytes_fp32, stats.wire_bytes_sent = sends.raw_bytes, sends.payload_bytes
        return stats

    def _post_receives(self, schedule: Schedule) -> dict[tuple[str, int], comm.PendingRecv]:
        recvs = {}
        for action in schedule.orders[self.rank]:
            b = action.microbatch
            if action.kind == "RECV_F":
                src = self.topology.rank_for(self.stage - 1, b)
                recvs[(action.kind, b)] = comm.PendingRecv(
                    src, comm.message_tag(comm.KIND_ACTIVATION, b), self.slot_sizes
                )
            elif action.kind == "RECV_B":
                src = self.topology.rank_for(self.stage + 1, b)
                recvs[(action.kind, b)] = comm.PendingRecv(
                    src, comm.message_tag(comm.KIND_GRADIENT, b), self.slot_sizes
                )
        return recvs

    @staticmethod
    def _drop_unused(
        snapshots: dict, in_flight: dict[int, _InFlight], needed: Counter, current: int | None
    ) -> None:
        """Free weight versions that no in-flight microbatch and no future forward will use."""
        used = {s.version for s in in_flight.values()} | {v for v, count in needed.items() if count > 0}
        if current is not None:
            used.add(current)
        for v in [v for v in snapshots if v not in used]:
            del snapshots[v]

    def _accumulate(self, grads: Sequence[torch.Tensor | None]) -> None:
        for p, g in zip(self.params.values(), grads, strict=True):
            if g is not None:
                p.grad = g.detach().clone() if p.grad is None else p.grad.add_(g)

    def _allreduce_grads(self) -> None:
        if self.topology.replicas[self.stage] < 2:
            return
        # Sum, not mean: replicas hold disjoint microbatches of one minibatch whose losses are
        # already scaled by 1/microbatches.
        for p in self.params.values():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=self.replica_group)

    # -- evaluation ---------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(
        self,
        chunks: Sequence[torch.Tensor] | None,
        targets: Sequence[torch.Tensor] | None,
        n_chunks: int,
        *,
        classify: bool = True,
    ) -> tuple[float, int, int]:
        """Forward-only pass over ``n_chunks`` chunks (chunk c on replica c % r of each stage).
        Returns (loss sum, correct, count) on the last stage's ranks, zeros elsewhere; ``correct``
        counts argmax hits when ``classify`` (class targets), else stays 0."""
        self.module.eval()
        loss_sum, correct, count, sends = 0.0, 0, 0, comm.PendingSends()
        try:
            for c in range(n_chunks):
                if self.topology.rank_for(self.stage, c) != self.rank:
                    continue
                tag = comm.message_tag(comm.KIND_EVAL, c)
                if self.is_first:
                    x = chunks[c]
                else:
                    x = comm.PendingRecv(self.topology.rank_for(self.stage - 1, c), tag).wait(self.timeout_s)
                out = self.module(x)
                if self.is_last:
                    loss_sum += float(self.loss_fn(out, targets[c])) * len(targets[c])
                    if classify:
                        correct += int((out.argmax(dim=1) == targets[c]).sum())
                    count += len(targets[c])
                else:
                    comm.send_tensor(out, self.topology.rank_for(self.stage + 1, c), tag, self.codec, sends)
            sends.wait_all(self.timeout_s)
        finally:
            self.module.train()
        return loss_sum, correct, count
