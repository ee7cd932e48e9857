"""One rank's measurements over a sync window, as a row of floats, and the ranks' rows combined into
the window's ``WindowTable`` (barrier.py).

The scheduler adds to ``WindowSums`` as the window runs. At the window's end ``tables`` lays this
rank's row into its own row of a zeroed ranks x columns block, which rides on the window's last
gradient message: summed across ranks, every rank gets every rank's row exactly (x + 0 = x), an
all-gather. ``combined_table`` reads the block back.

The row, each group per layer in forward order: blocked, forward, ready (means per iteration);
sync, queue, wire (means per message); collective (the shortest); then the iteration time (mean).

Invariant: ``combined_table`` reads exactly the layout ``tables`` writes, and every rank combines
the same rows the same way, so every rank feeds the same table to its policy engine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from cloud.training.sync.barrier import LayerWindow, WindowTable
from cloud.training.sync.link import PendingSync


class WindowSums:
    """The sums of one window on one rank, per layer (the scheduler adds to them)."""

    def __init__(self, order: tuple[str, ...]) -> None:
        self.order = order  # the layers, in forward order
        self.reset()

    def reset(self) -> None:
        order = self.order
        self.blocked = dict.fromkeys(order, 0.0)  # the forward's waits for the layer's sync
        self._sync = dict.fromkeys(order, 0.0)
        self._queue = dict.fromkeys(order, 0.0)
        self._wire = dict.fromkeys(order, 0.0)
        # the shortest collective per layer: a rank's collective also counts its wait for a late
        # peer, and over a window each rank is the late one at times
        self._reduce_min = dict.fromkeys(order, float("inf"))
        self.forward = dict.fromkeys(order, 0.0)  # the layer's forward compute
        self.ready = dict.fromkeys(order, 0.0)  # from backward's start to the layer's last gradient
        self._sync_count = dict.fromkeys(order, 0)
        self.iteration_s = 0.0
        self.iteration_started = time.monotonic()

    def record_sync(self, layer: str, pending: PendingSync) -> None:
        """Add a done message's times to ``layer``'s sums."""
        sync_s, queue_s, wire_s, reduce_s = pending.sync_s, pending.queue_s, pending.wire_s, pending.reduce_s
        if sync_s is None or queue_s is None or wire_s is None or reduce_s is None:
            return  # not done; a done message has all four (picked, on the wire, launched, done)
        self._sync[layer] += sync_s
        self._queue[layer] += queue_s
        self._wire[layer] += wire_s
        self._reduce_min[layer] = min(self._reduce_min[layer], reduce_s)
        self._sync_count[layer] += 1

    def tables(self, window: int, world: int, rank: int) -> torch.Tensor:
        """This rank's row (``window`` iterations; the running one so far) in its own row of a zeroed
        ``world`` x columns block, flattened."""
        order = self.order
        counts = [max(1, self._sync_count[name]) for name in order]
        iteration_s = self.iteration_s + time.monotonic() - self.iteration_started  # this one so far
        per_iteration = [self.blocked, self.forward, self.ready]
        per_message = [self._sync, self._queue, self._wire]
        row = (
            [sums[name] / window for sums in per_iteration for name in order]
            + [sums[name] / c for sums in per_message for name, c in zip(order, counts, strict=True)]
            + [self._reduce_min[name] if self._sync_count[name] else 0.0 for name in order]
            + [iteration_s / window]
        )
        tables = torch.zeros(world, len(row))
        tables[rank] = torch.tensor(row)
        return tables.reshape(-1)


def combined_table(
    tables: torch.Tensor,
    world: int,
    window_index: int,
    window: int,
    policy: str,
    layer_bytes: Mapping[str, int],
) -> WindowTable:
    """The window's table from the summed ``tables`` block (``layer_bytes``: each layer's gradient
    bytes, in forward order)."""
    rows = tables.reshape(world, -1).double()
    n = len(layer_bytes)
    columns = rows[:, :-1].reshape(world, -1, n)  # ranks x (the row's per-layer groups) x layers
    # compute (blocked, forward, ready): the slower rank sets the pace, max over ranks; message
    # times (sync, queue, wire, collective): min (a rank that launched early also counts the time
    # it waited for its peers); iteration: max
    blocked, forward, ready = columns[:, :3].amax(0)
    sync, queue, wire, reduce = columns[:, 3:].amin(0)
    return WindowTable(
        window_index,
        window,
        float(rows[:, -1].max()),
        policy,
        tuple(
            LayerWindow(
                name,
                i,
                nbytes,
                float(blocked[i]),
                float(sync[i]),
                float(queue[i]),
                wire_s=float(wire[i]),
                reduce_s=float(reduce[i]),
                forward_s=float(forward[i]),
                ready_s=float(ready[i]),
            )
            for i, (name, nbytes) in enumerate(layer_bytes.items())
        ),
    )
