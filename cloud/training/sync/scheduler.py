"""Barrier-scheduled gradient synchronisation: per-layer all-reduce from backward hooks, blockage
measured per layer, and a policy re-decided every window.

How an iteration runs. A post-accumulate-grad hook on every parameter notices when a bucket's
gradients are all ready and hands the bucket (flattened, scaled by the sample weight) to the comm
thread, unless the policy holds it behind the barrier. When backward ends, held and incomplete
buckets are handed over in forward order. The optimizer step is lazy and per layer: a forward
pre-hook on each layer waits for that layer's sync, writes the summed gradient back (views of the
received message), steps that layer's optimizer and clears its gradients; before it waits, it
steps the layers whose syncs already arrived, so their steps fill the wait instead of following
it. The time spent in that wait is the layer's blockage. The window also measures what the
planner (``predict.py``) models an iteration from: each layer's forward compute and when its gradients
were ready in backward, and each message's time on the wire and in its collective.
Every ``window`` iterations the ranks combine their tables (``window_sums.py``; blockage: max over
ranks; sync and queue time: min, since a rank that launched early also counts the time it waited
for its peers) and feed the same ``PolicyEngine``, so every rank switches to the same policy at the
same iteration.
The exchange rides on the window's last gradient message (each rank's table in its own slot of a
zeroed tail, so the sum is an all-gather; no message of its own, hence no extra round trip on the
link) and is read at the start of the next backward, so a window's end does not drain the lanes
(the next forward still overlaps the syncs in flight); the new policy applies from that backward on.

A caller that accumulates an iteration's gradients itself over several backwards (a pipeline
stage's microbatches) builds the scheduler with ``backward_hooks=False`` and calls ``hand_off``
once per iteration, after its last backward: the syncs start then, as at the end of a single
backward, and no hook starts one mid-iteration.

Invariant: each parameter's gradient is summed across the group exactly once per iteration and
stepped before the layer's next forward, so the trajectory is synchronous SGD whatever the policy
(equal to DDP's to float rounding; tests/sync checks 1e-6).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from cloud.training.sync.barrier import SyncPolicy, WindowTable
from cloud.training.sync.engine import PolicyEngine
from cloud.training.sync.link import CommThread, LinkDelay, PendingSync, Reducer, SharedWire
from cloud.training.sync.rules import EngineConfig
from cloud.training.sync.window_sums import WindowSums, combined_table

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


class SyncScheduler:
    def __init__(
        self,
        model: nn.Module,
        make_optimizer: OptimizerFactory,
        *,
        group: dist.ProcessGroup | None = None,
        window: int = 8,
        adaptive: bool = True,
        policy: SyncPolicy | str | None = None,
        engine: EngineConfig = EngineConfig(),
        link: LinkDelay | None = None,
        progress_path: str | Path | None = None,
        priority_group: dist.ProcessGroup | None = None,
        timeout_s: float = 120.0,
        backward_hooks: bool = True,
        reducer_for: Callable[[dist.ProcessGroup | None], Reducer] | None = None,
    ) -> None:
        """``reducer_for``: builds each lane's all-reduce from the lane's group (e.g. packed trees,
        ``cloud.training.collectives.reducer``); None: ``dist.all_reduce``."""
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.window = window
        self.timeout_s = timeout_s
        self.progress_path = Path(progress_path) if progress_path else None
        self.sample_weight = 1.0 / self.world  # plain averaging; the balancer sets local/global
        self.blocked_s = 0.0  # forward waits for syncs so far (not compute: a speed timer leaves it out)

        # Layers are the modules that own parameters, numbered in registration order, which is the
        # order a Sequential's forward uses them; the policy's "forward order" relies on that.
        self.layers: dict[str, list[nn.Parameter]] = {
            name: list(module.parameters(recurse=False))
            for name, module in model.named_modules()
            if next(module.parameters(recurse=False), None) is not None
        }
        self.forward_order = tuple(self.layers)
        self._forward_index = {name: i for i, name in enumerate(self.forward_order)}
        self._layer_of = {id(p): name for name, params in self.layers.items() for p in params}
        self.optimizers = {name: make_optimizer(params) for name, params in self.layers.items()}

        initial = SyncPolicy.parse(policy) if isinstance(policy, str) else policy
        initial = initial or SyncPolicy.per_layer(self.forward_order)
        initial.validate(self.forward_order)
        self.engine = PolicyEngine(initial, engine, adaptive)

        with torch.no_grad():  # same start on every rank, as DDP does
            for param in model.parameters():
                dist.broadcast(param, src=dist.get_global_rank(group, 0) if group else 0, group=group)
        if priority_group is None:  # a collective over the default group: every process must construct
            ranks = dist.get_process_group_ranks(group) if group is not None else None
            priority_group = dist.new_group(ranks=ranks, backend="gloo")
        wire = SharedWire()
        reducers = (reducer_for(group), reducer_for(priority_group)) if reducer_for else (None, None)
        self.comm = CommThread(group, link, wire, reducer=reducers[0])
        self.priority_comm = CommThread(priority_group, link, wire, priority=True, reducer=reducers[1])
        # the message carrying the window's tables in flight: (message, where the tables start, policy)
        self._exchange: tuple[PendingSync, int, str] | None = None

        self._pending: dict[str, PendingSync] = {}
        # one message buffer per bucket of the current policy, reused every iteration as DDP reuses
        # its bucket buffers (a fresh 2 MB tensor per layer per iteration costs page faults)
        # keyed by (bucket, carries the window's tables)
        self._buffers: dict[tuple[tuple[str, ...], bool], torch.Tensor] = {}
        self._in_backward = False
        self._backward_started = 0.0
        self._layer_ready: dict[str, int] = {}  # gradients ready per layer in this backward
        self._last_forward: tuple[str, float] | None = None  # the layer whose forward runs, since when
        self._launched: set[tuple[str, ...]] = set()
        self.iteration = 0
        self.window_index = 0
        self.tables: list[WindowTable] = []
        self._sums = WindowSums(self.forward_order)  # this window's measurements on this rank
        self._handles = [
            module.register_forward_pre_hook(self._make_pre_hook(name))
            for name, module in model.named_modules()
            if name in self.layers
        ]
        if backward_hooks:
            self._handles += [
                p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in model.parameters()
            ]

    # ------------------------------------------------------------------ public

    @property
    def policy(self) -> SyncPolicy:
        return self.engine.policy

    @property
    def link(self) -> LinkDelay:
        return self.comm.link

    @link.setter
    def link(self, link: LinkDelay) -> None:
        """Swap the emulated link (fault injection); takes effect for messages not yet launched."""
        self.comm.link = self.priority_comm.link = link

    def set_sample_weight(self, weight: float) -> None:
        """Scale applied to local gradients before the sum (local samples / global batch)."""
        self.sample_weight = weight

    def hand_off(self) -> None:
        """The iteration's gradients are complete in ``.grad`` (``backward_hooks=False``): start
        their syncs, as at the end of the iteration's one backward (last layer's gradients first)."""
        self._start_backward()
        for name in reversed(self.forward_order):
            for param in self.layers[name]:
                self._grad_ready(param)
        self._on_backward_end()

    def finish(self) -> None:
        """Wait for every sync in flight and apply the pending steps (call before reading weights)."""
        for name in self.forward_order:
            self._consume(name, record=False)
        self._apply_window()
        self._sums.iteration_started = time.monotonic()  # time until the next iteration is not training

    def close(self) -> None:
        self.finish()
        for handle in self._handles:
            handle.remove()
        self.comm.close()
        self.priority_comm.close()

    def status(self) -> dict:
        """JSON-able view for the job status: current policy, last table, decisions so far."""
        return {
            "policy": self.policy.text(),
            "iteration": self.iteration,
            "window": self.window_index,
            "last_window": self.tables[-1].as_dict() if self.tables else None,
            "decisions": list(self.engine.decisions),
            "comm_full_waits": self.comm.full_waits + self.priority_comm.full_waits,
            "reducer_runs": self.comm.reducer_runs + self.priority_comm.reducer_runs,
        }

    # ------------------------------------------------------------------ backward side

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if not self._in_backward:
            self._start_backward()
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
        self._grad_ready(param)

    def _start_backward(self) -> None:
        self._backward_started = time.monotonic()
        self._close_forward(self._backward_started)  # the last layer's forward ran until now
        self._apply_window()  # the last window's combined table decides this backward's policy
        self._in_backward = True
        self._launched, self._layer_ready = set(), {}

    def _grad_ready(self, param: torch.Tensor) -> None:
        layer = self._layer_of[id(param)]
        self._layer_ready[layer] = self._layer_ready.get(layer, 0) + 1
        if not self._layer_complete(layer):
            return
        self._sums.ready[layer] += time.monotonic() - self._backward_started
        bucket = self.policy.bucket_of(layer)
        if not self.policy.bucket_held(bucket) and all(self._layer_complete(name) for name in bucket):
            self._launch(bucket)

    def _layer_complete(self, layer: str) -> bool:
        """Every gradient of ``layer`` is ready in this backward."""
        return self._layer_ready.get(layer, 0) == len(self.layers[layer])

    def _on_backward_end(self) -> None:
        self._in_backward = False
        rest = [b for b in self.policy.buckets if b not in self._launched]
        for bucket in sorted(rest, key=lambda b: min(self._forward_index[n] for n in b)):
            self._launch(bucket)  # the barrier: held buckets go out now, first-needed first
        self.iteration += 1
        now = time.monotonic()
        self._sums.iteration_s += now - self._sums.iteration_started
        self._sums.iteration_started = now
        if self.iteration % self.window == 0:
            self._sums.reset()  # the window's tables left with its last message

    def _launch(self, bucket: tuple[str, ...]) -> None:
        for name in bucket:
            self._consume(name, record=False)  # a layer the last forward skipped: step it before reuse
        params = [p for name in bucket for p in self.layers[name]]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        numel = sum(grad.numel() for grad in grads)
        # the iteration's last message at a window's end also carries the window's tables
        last = len(self._launched) == len(self.policy.buckets) - 1
        at_window_end = last and (self.iteration + 1) % self.window == 0
        tables = self._sums.tables(self.window, self.world, self.rank) if at_window_end else None
        flat = self._buffer(bucket, numel, grads[0].dtype, 0 if tables is None else tables.numel())
        offset = 0
        for grad in grads:  # scaled straight into the message: one pass, not a copy then a scale
            torch.mul(grad.reshape(-1), self.sample_weight, out=flat[offset : offset + grad.numel()])
            offset += grad.numel()
        if tables is not None:
            flat[numel:] = tables
        lane = self.priority_comm if self.policy.bucket_first(bucket) else self.comm
        pending = lane.submit(flat, bucket)
        if tables is not None:
            self._exchange = (pending, numel, self.policy.text())
        self._launched.add(bucket)
        for name in bucket:
            self._pending[name] = pending

    def _buffer(self, bucket: tuple[str, ...], numel: int, dtype: torch.dtype, tail: int) -> torch.Tensor:
        """The bucket's reusable message (free: the bucket's last sync was consumed before launch, and
        a message with a tables tail was read by ``_apply_window`` before the next launch)."""
        key = (bucket, tail > 0)  # the window's last message keeps its own buffer: no realloc per window
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() != numel + tail or buffer.dtype != dtype:
            if len(self._buffers) >= 3 * len(self.forward_order):  # buckets of old policies
                self._buffers.clear()
            buffer = self._buffers[key] = torch.empty(numel + tail, dtype=dtype)
        return buffer

    # ------------------------------------------------------------------ forward side

    def _make_pre_hook(self, name: str) -> Callable:
        first = self._forward_index[name] == 0

        def pre_hook(_module: nn.Module, _args: object) -> None:
            if first:
                self._last_forward = None  # a new forward pass (the previous one may not have trained)
            self._close_forward(time.monotonic())
            self._consume(name, record=True)
            self._last_forward = (name, time.monotonic())

        return pre_hook

    def _close_forward(self, now: float) -> None:
        """The layer whose forward was running is done: count its compute time."""
        if self._last_forward is not None:
            name, started = self._last_forward
            self._sums.forward[name] += now - started
            self._last_forward = None

    def _consume(self, name: str, *, record: bool) -> None:
        pending = self._pending.get(name)
        if pending is None:
            return
        if record and not pending.done:
            self._step_synced()  # use the wait: step the layers whose syncs already arrived
        started = time.monotonic()
        pending.wait(self.timeout_s)
        if record:
            waited = time.monotonic() - started
            self._sums.blocked[name] += waited
            self.blocked_s += waited
        self._step(pending)

    def _step_synced(self) -> None:
        for name in self.forward_order:
            pending = self._pending.get(name)
            if pending is not None and pending.done:
                pending.wait(self.timeout_s)  # returns at once; raises if the all-reduce failed
                self._step(pending)

    def _step(self, pending: PendingSync) -> None:
        """Write the summed gradient back (views of the received message, no copy) and step its layers."""
        flat = pending.tensor
        offset = 0
        with torch.no_grad():
            for layer in pending.layers:
                for param in self.layers[layer]:
                    count = param.numel()
                    param.grad = flat[offset : offset + count].view_as(param)
                    offset += count
                self.optimizers[layer].step()
                self.optimizers[layer].zero_grad(set_to_none=True)
                del self._pending[layer]
                self._sums.record_sync(layer, pending)

    # ------------------------------------------------------------------ window

    def _apply_window(self) -> None:
        if self._exchange is None:
            return
        pending, offset, policy_text = self._exchange
        self._exchange = None
        tables = pending.wait(self.timeout_s)[offset:]
        layer_bytes = {
            name: sum(p.numel() * p.element_size() for p in params) for name, params in self.layers.items()
        }
        table = combined_table(tables, self.world, self.window_index, self.window, policy_text, layer_bytes)
        self.tables.append(table)
        decisions_before = len(self.engine.decisions)
        self.engine.end_window(table)
        self._write_progress(table, self.engine.decisions[decisions_before:])
        self.window_index += 1

    def _write_progress(self, table: WindowTable, decisions: Iterable[dict]) -> None:
        if self.progress_path is None or dist.get_rank(self.group) != 0:
            return
        with self.progress_path.open("a") as out:
            out.write(
                json.dumps(
                    {
                        "kind": "sync_window",
                        **table.as_dict(),
                        "decisions": list(decisions),
                        "next_policy": self.policy.text(),
                    }
                )
                + "\n"
            )
