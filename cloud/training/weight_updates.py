"""How a stage's gradients become weight updates, as ``schedule.update`` says (executor.py runs them).

- ``flush`` (GPipe, 1F1B-flush): gradients of all microbatches accumulate (``accumulate``; each
  loss scaled by 1/microbatches, or by its share of the minibatch's samples when ``run_step`` is
  told their count: microbatches of unequal sizes), replicas of a stage sum them in their own
  process group (``sum_over_replicas``), then one optimizer step: the same update as
  single-process training with gradient accumulation. A ``flush_gradients`` callback replaces
  that sum and step (the ``SyncScheduler`` takes the summed gradients and steps each layer
  before its next forward).
- ``per_microbatch`` (1F1B-stash, PipeDream): every backward is followed by an optimizer step.
  The forward of microbatch b runs on a snapshot of the weights (the newest version, or with
  vertical sync the version stage 0 used), and its backward differentiates that same snapshot:
  weight stashing (``WeightStash``).

Invariant: a microbatch's backward differentiates the weight version its forward ran on, and a
stashed version is kept only while an in-flight microbatch, a forward still to run or (without
vertical sync) the newest version needs it: the stash frees every other one at each update.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
import torch.distributed as dist

Grads = Sequence[torch.Tensor | None]  # per parameter, in named_parameters order; None: unused


def accumulate(params: Iterable[torch.Tensor], grads: Grads) -> None:
    """Add ``grads`` to the parameters' ``.grad`` (flush updates)."""
    for p, g in zip(params, grads, strict=True):
        if g is not None:
            p.grad = g.detach().clone() if p.grad is None else p.grad.add_(g)


def sum_over_replicas(
    params: Sequence[torch.Tensor],
    group: dist.ProcessGroup | None,
    all_reduce: Callable[[torch.Tensor], object] | None,
) -> None:
    """Sum the parameters' ``.grad`` over the stage's replicas, in place: ``all_reduce`` sums a flat
    tensor over the replica group (``sync.collective``); None: ``dist.all_reduce`` per parameter."""
    # Sum, not mean: replicas hold disjoint microbatches of one minibatch whose losses are
    # already scaled by 1/microbatches.
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if all_reduce is None:
        for p in params:
            dist.all_reduce(p.grad, group=group)
        return
    # one message for the stage: a program pays its steps once, not once per parameter
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce(flat)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


class WeightStash:
    """One step's weight versions of one stage (per_microbatch updates)."""

    def __init__(
        self, params: Mapping[str, torch.Tensor], tags: dict[int, int], forwards: Iterable[int], stage: int
    ) -> None:
        """``tags``: vertical sync's microbatch -> weight version (empty: each forward uses the
        newest); ``forwards``: the microbatches whose forward the step runs; ``stage``: for errors."""
        self._params, self._tags, self._stage = params, tags, stage
        # vertical sync: weight version -> forwards still to run on it
        self._needed = Counter(tags[b] for b in forwards) if tags else Counter()
        self.version = 0  # updates applied so far
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}  # version -> weights
        if not tags or self._needed[0]:
            self._snapshots[0] = self._snapshot()

    def forward_weights(self, b: int) -> tuple[int, dict[str, torch.Tensor]]:
        """The weight version microbatch ``b``'s forward runs on, and its stashed weights."""
        version = self._tags.get(b, self.version)
        params = self._snapshots.get(version)
        if params is None:
            raise RuntimeError(f"stage {self._stage}: weight version {version} of microbatch {b} not kept")
        return version, params

    def forward_ran(self, version: int) -> None:
        if self._tags:
            self._needed[version] -= 1

    def updated(self, in_flight: Iterable[int]) -> None:
        """The weights were just updated: a new version, stashed if a forward will run on it; free
        the versions that no in-flight microbatch (``in_flight``: their versions) and no future
        forward will use."""
        self.version += 1
        if not self._tags or self._needed[self.version]:
            self._snapshots[self.version] = self._snapshot()
        used = set(in_flight) | {v for v, count in self._needed.items() if count > 0}
        if not self._tags:
            used.add(self.version)
        for v in [v for v in self._snapshots if v not in used]:
            del self._snapshots[v]

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone().requires_grad_(True) for name, p in self._params.items()}
