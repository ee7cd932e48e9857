"""The one executor: runs a rank's schedule actions for its pipeline stage (or stage replica).

``StageExecutor.run_step`` walks ``schedule.orders[rank]`` in order, handing each action to the
handler of its kind (one method per kind): ``RECV_*`` waits for a receive
posted at the start of the step (sized from the slot's last message, so transfers overlap
compute; see ``comm``), ``F``/``B`` compute, ``SEND_*`` posts an ``isend``. Backward uses
``torch.autograd.grad`` with explicit inputs, so gradients land only where the executor puts them.

On every stage but the first, a plain ``nn.Sequential`` stage without activation compression splits
its backward (``backward.py``): ``B`` computes the input gradient, ``SEND_B`` ships it, and the weight
gradients follow before the next action, so the previous stage stops waiting one weight-gradient pass
sooner. (With compression a split would decompress each saved activation twice.)

Weight updates follow ``schedule.update`` (``weight_updates.py``): ``flush`` accumulates the
microbatches' gradients, sums them over the stage's replicas and steps once; ``per_microbatch``
steps after every backward, each microbatch's forward and backward on one stashed weight version.

Options: ``autocast`` is entered around the stage's own forward only (bf16): its output is cast
back to fp32, so the loss, the tensors sent and the gradients stay fp32. ``record_answers`` (last
stage, classification) keeps each microbatch's per-sample right/wrong in ``StepStats.answers``.
Devices: the executor computes on ``device`` (default: where the module's parameters are); inputs,
targets and received tensors are moved there, and messages travel as ``comm`` places them.

Invariant: after ``run_step`` returns, no send or receive of the step is outstanding and no
microbatch state (activations, stashed weights) is left over.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from cloud.training import backward, comm
from cloud.training.schedules import Action, ActionKind, Schedule, Topology
from cloud.training.weight_updates import Grads, WeightStash, accumulate, sum_over_replicas


@dataclass
class StepStats:
    busy_s: float = 0.0  # compute: forward, backward, optimizer
    idle_s: float = 0.0  # waiting for receives, sends and the replica all-reduce
    loss_sum: float = 0.0  # last stage only: sum of unscaled microbatch losses
    n_losses: int = 0
    bytes_sent: int = 0
    wire_bytes_fp32: int = 0  # boundary tensors sent, at their uncompressed size
    wire_bytes_sent: int = 0  # the codec payloads actually sent for them
    # last stage with ``record_answers``: per microbatch, whether each sample's argmax hit its target
    answers: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class _InFlight:
    inputs: torch.Tensor
    output: torch.Tensor  # stage output, or the scaled loss on the last stage
    params: dict[str, torch.Tensor] | None  # the stashed weight version (per_microbatch only)
    version: int
    tape: backward.LayerTape | None  # split backward: the layer outputs its weight pass needs


@dataclass
class _Step:
    """One step's state, which the action handlers read and update."""

    inputs: dict[int, torch.Tensor] | None  # stage 0: by microbatch
    targets: dict[int, torch.Tensor] | None  # last stage: by microbatch
    stash: WeightStash | None  # per_microbatch updates: the weight versions; None: flush
    scale: float  # of each microbatch's loss
    batch_samples: int | None  # flush with unequal microbatches: a loss is scaled by its samples / this
    recvs: dict[tuple[ActionKind, int], comm.PendingRecv]  # posted, not yet waited
    stats: StepStats = field(default_factory=StepStats)
    sends: comm.PendingSends = field(default_factory=comm.PendingSends)
    received: dict[tuple[ActionKind, int], torch.Tensor] = field(default_factory=dict)
    in_flight: dict[int, _InFlight] = field(default_factory=dict)
    input_grads: dict[int, torch.Tensor] = field(default_factory=dict)  # computed, not yet sent
    deferred: tuple[backward.LayerTape, list[torch.Tensor | None]] | None = None  # a weight pass to run


def _given(
    tensors: Mapping[int, torch.Tensor] | Sequence[torch.Tensor] | None, index: int, what: str
) -> torch.Tensor:
    if tensors is None:
        raise ValueError(f"{what}[{index}] is needed, but {what} is None")
    return tensors[index]


class StageExecutor:
    def __init__(
        self,
        module: nn.Module,
        topology: Topology,
        rank: int,
        *,
        optimizer: torch.optim.Optimizer | None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        codec: comm.WireCodec | None = None,
        replica_group: dist.ProcessGroup | None = None,
        timeout_s: float = 120.0,
        activation_context: Callable[[], AbstractContextManager] | None = None,
        autocast: Callable[[], AbstractContextManager] | None = None,
        flush_gradients: Callable[[], None] | None = None,
        record_answers: bool = False,
        device: torch.device | None = None,
        channels: comm.Channels | None = None,
        all_reduce: Callable[[torch.Tensor], object] | None = None,
    ):
        self.module, self.topology, self.rank = module, topology, rank
        self.stage, self.replica = topology.stage_replica_of(rank)
        self.is_first, self.is_last = self.stage == 0, self.stage == topology.n_stages - 1
        self.optimizer, self.loss_fn = optimizer, loss_fn
        self.codec = codec or comm.Fp32Codec()
        self.replica_group, self.timeout_s = replica_group, timeout_s
        # sums a flat tensor over the replica group in place (``sync.collective``); None: dist.all_reduce
        self.all_reduce = all_reduce
        self.params = dict(module.named_parameters())
        first_param = next(iter(self.params.values()), None)
        self.device = device or (first_param.device if first_param is not None else torch.device("cpu"))
        self.channels = channels or comm.Channels.default()  # enough for gloo (see comm)
        # the stage's layers when its backward splits (see the module docstring), else None
        self._split_layers = (
            module
            if not self.is_first and activation_context is None and backward.splittable(module)
            else None
        )
        self.split_backward = self._split_layers is not None
        self.slot_sizes = comm.SlotSizes()  # capacities of eager payload receives, per peer and tag
        # Entered around every training forward: e.g. ActivationCompressor.active, whose
        # saved-tensor hooks store what backward needs compressed.
        self.activation_context = activation_context or contextlib.nullcontext
        # Entered around the stage's forward only (e.g. bf16 autocast): the loss, the tensors sent
        # and the parameters stay fp32.
        self.autocast = autocast or contextlib.nullcontext
        self.flush_gradients, self.record_answers = flush_gradients, record_answers
        # One handler per action kind, as the schedule is data.
        self._handlers: dict[ActionKind, Callable[[_Step, Action], None]] = {
            "RECV_F": self._receive,
            "RECV_B": self._receive,
            "F": self._forward,
            "SEND_F": self._send_activation,
            "B": self._backward,
            "SEND_B": self._send_input_gradient,
        }

    # -- weight updates (weight_updates.py) --------------------------------------------------------
    def _apply_update(self, grads: Grads) -> None:
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
        batch_samples: int | None = None,
    ) -> StepStats:
        """Run this rank's actions; ``inputs`` (stage 0) and ``targets`` (last stage) by microbatch;
        ``batch_samples``: the minibatch's samples, given when its microbatches differ in size."""
        step = self._begin_step(schedule, inputs, targets, batch_samples)
        for action in schedule.orders[self.rank]:
            for pending in step.recvs.values():
                pending.poll()
            if action.kind != "SEND_B":  # a split backward sends its input gradient first
                self._run_deferred(step)
            self._handlers[action.kind](step, action)
        self._run_deferred(step)
        self._end_step(step)
        return step.stats

    def _begin_step(
        self,
        schedule: Schedule,
        inputs: dict[int, torch.Tensor] | None,
        targets: dict[int, torch.Tensor] | None,
        batch_samples: int | None,
    ) -> _Step:
        if schedule.topology != self.topology:
            raise ValueError("schedule built for another topology")
        stashing = schedule.update == "per_microbatch"
        if stashing and max(self.topology.replicas) > 1:
            raise NotImplementedError("1f1b-stash with replicated stages")
        recvs = self._post_receives(schedule)
        stash = None
        if stashing:
            tags = schedule.stash_versions() if schedule.vertical_sync else {}
            forwards = (a.microbatch for a in schedule.orders[self.rank] if a.kind == "F")
            stash = WeightStash(self.params, tags, forwards, self.stage)
        scale = 1.0 if stashing else 1.0 / schedule.n_microbatches
        return _Step(inputs, targets, stash, scale, None if stashing else batch_samples, recvs)

    def _receive(self, step: _Step, action: Action) -> None:
        start = time.perf_counter()
        key = (action.kind, action.microbatch)
        step.received[key] = step.recvs.pop(key).wait(self.timeout_s, self.device)
        step.stats.idle_s += time.perf_counter() - start

    def _send_activation(self, step: _Step, action: Action) -> None:
        b = action.microbatch
        comm.send_tensor(
            step.in_flight[b].output.detach(),
            self.topology.rank_for(self.stage + 1, b),
            comm.message_tag(comm.KIND_ACTIVATION, b),
            self.codec,
            step.sends,
            self.slot_sizes,
            self.channels.forward,
        )

    def _send_input_gradient(self, step: _Step, action: Action) -> None:
        b = action.microbatch
        comm.send_tensor(
            step.input_grads.pop(b),
            self.topology.rank_for(self.stage - 1, b),
            comm.message_tag(comm.KIND_GRADIENT, b),
            self.codec,
            step.sends,
            self.slot_sizes,
            self.channels.backward,
        )

    def _forward(self, step: _Step, action: Action) -> None:
        start = time.perf_counter()
        b = action.microbatch
        if self.is_first:
            x = _given(step.inputs, b, "inputs").to(self.device)
        else:
            x = step.received.pop(("RECV_F", b)).requires_grad_(True)
        version, params = step.stash.forward_weights(b) if step.stash is not None else (0, None)
        with self.activation_context():
            with self.autocast():
                tape, out = self._stage_forward(x, params)
            out = out.float()  # a no-op unless autocast ran the forward in lower precision
            target = _given(step.targets, b, "targets").to(self.device) if self.is_last else None
            loss = self.loss_fn(out, target) if target is not None else None
        if target is not None and loss is not None:  # the last stage: backward starts from the scaled loss
            step.stats.loss_sum += float(loss.detach())
            step.stats.n_losses += 1
            if self.record_answers:
                step.stats.answers[b] = out.detach().argmax(dim=1) == target
            out = loss * (len(target) / step.batch_samples if step.batch_samples else step.scale)
        step.in_flight[b] = _InFlight(x, out, params, version, tape)
        if step.stash is not None:
            step.stash.forward_ran(version)
        step.stats.busy_s += time.perf_counter() - start

    def _stage_forward(
        self, x: torch.Tensor, params: dict[str, torch.Tensor] | None
    ) -> tuple[backward.LayerTape | None, torch.Tensor]:
        if self._split_layers is not None:
            tape = backward.LayerTape(self._split_layers, x, params)
            return tape, tape.output
        if params is not None:
            return None, functional_call(self.module, params, (x,))
        return None, self.module(x)

    def _backward(self, step: _Step, action: Action) -> None:
        start = time.perf_counter()
        b = action.microbatch
        state = step.in_flight.pop(b)
        grad_out = None if self.is_last else step.received.pop(("RECV_B", b))
        if state.tape is not None:  # split: the weight pass waits for SEND_B (``_run_deferred``)
            step.input_grads[b], output_grads = backward.input_gradient(
                state.tape, state.output, state.inputs, grad_out
            )
            step.deferred = (state.tape, output_grads)
        else:
            weights = list((state.params or self.params).values())
            wrt = ([] if self.is_first else [state.inputs]) + weights
            grads = torch.autograd.grad(state.output, wrt, grad_out, allow_unused=True) if wrt else ()
            input_grad, weight_grads = (None, grads) if self.is_first else (grads[0], grads[1:])
            self._apply_weight_grads(step, weight_grads)
            if input_grad is not None:
                step.input_grads[b] = input_grad
        step.stats.busy_s += time.perf_counter() - start

    def _run_deferred(self, step: _Step) -> None:
        """A split backward's weight pass, if one is pending."""
        if step.deferred is None:
            return
        start = time.perf_counter()
        (tape, output_grads), step.deferred = step.deferred, None
        self._apply_weight_grads(step, backward.weight_gradients(tape, output_grads))
        step.stats.busy_s += time.perf_counter() - start

    def _apply_weight_grads(self, step: _Step, weight_grads: Grads) -> None:
        if step.stash is None:
            accumulate(self.params.values(), weight_grads)
            return
        self._apply_update(weight_grads)
        step.stash.updated(s.version for s in step.in_flight.values())

    def _end_step(self, step: _Step) -> None:
        """Wait for the sends; with flush updates, sum the replicas' gradients and step."""
        start = time.perf_counter()
        step.sends.wait_all(self.timeout_s)
        if step.in_flight or step.recvs:
            raise RuntimeError(f"rank {self.rank}: unfinished microbatches {sorted(step.in_flight)}")
        flush = step.stash is None
        if flush and self.flush_gradients is not None:
            self.flush_gradients()  # it sums across replicas and steps the weights itself
        elif flush and self.topology.replicas[self.stage] > 1:
            sum_over_replicas(list(self.params.values()), self.replica_group, self.all_reduce)
        step.stats.idle_s += time.perf_counter() - start
        if flush and self.flush_gradients is None:
            start = time.perf_counter()
            self._optimizer_step()
            step.stats.busy_s += time.perf_counter() - start
        step.stats.bytes_sent = step.sends.bytes_sent
        step.stats.wire_bytes_fp32 = step.sends.raw_bytes
        step.stats.wire_bytes_sent = step.sends.payload_bytes

    def _post_receives(self, schedule: Schedule) -> dict[tuple[ActionKind, int], comm.PendingRecv]:
        recvs: dict[tuple[ActionKind, int], comm.PendingRecv] = {}
        for action in schedule.orders[self.rank]:
            b = action.microbatch
            if action.kind == "RECV_F":
                src = self.topology.rank_for(self.stage - 1, b)
                recvs[(action.kind, b)] = comm.PendingRecv(
                    src, comm.message_tag(comm.KIND_ACTIVATION, b), self.slot_sizes, self.channels.forward
                )
            elif action.kind == "RECV_B":
                src = self.topology.rank_for(self.stage + 1, b)
                recvs[(action.kind, b)] = comm.PendingRecv(
                    src, comm.message_tag(comm.KIND_GRADIENT, b), self.slot_sizes, self.channels.backward
                )
        return recvs

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
                    x = _given(chunks, c, "chunks").to(self.device)
                else:
                    src = self.topology.rank_for(self.stage - 1, c)
                    x = comm.PendingRecv(src, tag, channel=self.channels.forward).wait(
                        self.timeout_s, self.device
                    )
                with self.autocast():
                    out = self.module(x).float()
                if self.is_last:
                    target = _given(targets, c, "targets").to(self.device)
                    loss_sum += float(self.loss_fn(out, target)) * len(target)
                    if classify:
                        correct += int((out.argmax(dim=1) == target).sum())
                    count += len(target)
                else:
                    dst = self.topology.rank_for(self.stage + 1, c)
                    comm.send_tensor(out, dst, tag, self.codec, sends, channel=self.channels.forward)
            sends.wait_all(self.timeout_s)
        finally:
            self.module.train()
        return loss_sum, correct, count
