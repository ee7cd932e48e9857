"""The comm thread: the one place that launches one process group's gradient all-reduces.

Collectives must be issued in the same order on every rank, so all of them go through one FIFO
thread per group (a *lane*) that launches them in the order the trainer handed them over. A lane
can also stand in for a slow link (``LinkDelay``), as an injected fault or an emulated link, never
in a normal run: ``per_message_s + per_byte_s * bytes`` occupies a wire shared by every lane of the
process (so a second lane adds no bandwidth), and ``per_layer_s`` stalls this lane before it
launches that layer's message (head-of-line: later messages of the lane queue behind it). The
emulated wire sleeps (releasing the GIL, burning no CPU), as a slow network looks to the host; a
lane marked ``priority`` takes the wire before waiting ordinary messages, at message granularity
(the message on the wire is not pre-empted), as ByteScheduler's priority queue does.
A lane given a ``reducer`` (an in-place sum over the lane's group that returns when done, e.g. a
packed-tree all-reduce of ``cloud.training.collectives``) runs it in the comm thread instead of
``dist.all_reduce``: the lane then has one message in its collective at a time.

Invariant: messages are launched in hand-over order, one at a time; ``submit`` blocks (with a
timeout) when ``max_pending`` messages are waiting, and counts how often it had to.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class LinkDelay:
    """Time a message spends on an emulated link before the real all-reduce starts."""

    per_message_s: float = 0.0
    per_byte_s: float = 0.0
    per_layer_s: Mapping[str, float] = field(default_factory=dict)  # injected delay on one layer's sync

    def wire_s(self, nbytes: int) -> float:
        return self.per_message_s + self.per_byte_s * nbytes

    def stall_s(self, layers: tuple[str, ...]) -> float:
        return sum(self.per_layer_s.get(name, 0.0) for name in layers)


Reducer = Callable[[torch.Tensor], object]  # sums a tensor over the lane's group in place, blocking


class SharedWire:
    """The emulated link's serial resource: one message occupies it at a time, across lanes;
    when it frees up, a waiting priority message goes before waiting ordinary ones."""

    def __init__(self) -> None:
        self._free = threading.Condition()
        self._busy = False
        self._priority_waiting = 0

    def occupy(self, seconds: float, priority: bool = False, timeout_s: float = 60.0) -> float:
        """Hold the wire for ``seconds``; returns when the message got it (monotonic clock)."""
        with self._free:
            if priority:
                self._priority_waiting += 1
            try:
                ok = self._free.wait_for(
                    lambda: not self._busy and (priority or not self._priority_waiting), timeout_s
                )
            finally:
                if priority:
                    self._priority_waiting -= 1
            if not ok:
                raise TimeoutError(f"emulated wire not free within {timeout_s} s")
            self._busy = True
        acquired = time.monotonic()
        try:
            time.sleep(seconds)  # a sleep releases the GIL: the host is idle while bytes are on the wire
        finally:
            with self._free:
                self._busy = False
                self._free.notify_all()
        return acquired


def _span(start: float | None, end: float | None) -> float | None:
    """``end - start``, or None while either moment has not happened yet."""
    return None if start is None or end is None else end - start


class PendingSync:
    """One message in flight: the tensor being summed across ranks and when it got done."""

    def __init__(self, tensor: torch.Tensor, layers: tuple[str, ...]) -> None:
        self.tensor = tensor
        self.layers = layers
        self.handed_at = time.monotonic()
        self.picked_at: float | None = None
        self.on_wire_at: float | None = None  # got the emulated wire (= launched_at without one)
        self.launched_at: float | None = None  # the collective was issued
        self.done_at: float | None = None
        self._launched = threading.Event()
        self._work: dist.Work | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[PendingSync], None]] = []
        self._lock = threading.Lock()

    def wait(self, timeout_s: float) -> torch.Tensor:
        if not self._launched.wait(timeout_s):
            raise TimeoutError(f"sync of {self.layers} not launched within {timeout_s} s")
        if self._error is not None:
            raise RuntimeError(f"sync of {self.layers} failed to launch") from self._error
        if self._work is not None:  # None: a reducer summed it before the launch was signalled
            self._work.wait(timeout=timedelta(seconds=timeout_s))
        return self.tensor

    @property
    def done(self) -> bool:
        """The all-reduce has completed (``wait`` returns at once)."""
        return self.done_at is not None

    @property
    def queue_s(self) -> float | None:
        """Time queued in the lane behind earlier messages, from hand-off to the comm thread picking it."""
        return _span(self.handed_at, self.picked_at)

    @property
    def sync_s(self) -> float | None:
        """Time on the link: from the comm thread picking it up to the all-reduce being done."""
        return _span(self.picked_at, self.done_at)

    @property
    def wire_s(self) -> float | None:
        """Time the message held the emulated wire (0 on a link with no emulated delay)."""
        return _span(self.on_wire_at, self.launched_at)

    @property
    def reduce_s(self) -> float | None:
        """Time of the collective itself, from launch to done (waiting for the peers included)."""
        return _span(self.launched_at, self.done_at)

    def on_done(self, callback: Callable[[PendingSync], None]) -> None:
        with self._lock:
            if self.done_at is None:
                self._callbacks.append(callback)
                return
        callback(self)

    def _mark_done(self) -> None:
        with self._lock:
            self.done_at = time.monotonic()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)


_STOP = object()


class CommThread:
    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        link: LinkDelay | None = None,
        wire: SharedWire | None = None,
        max_pending: int = 1024,
        submit_timeout_s: float = 60.0,
        priority: bool = False,
        reducer: Reducer | None = None,
    ) -> None:
        self.group = group
        self.reducer = reducer  # None: dist.all_reduce on the group
        self.priority = priority  # this lane's messages take the shared wire before ordinary ones
        self.link = link or LinkDelay()
        self.wire = wire or SharedWire()
        self.submit_timeout_s = submit_timeout_s
        self.full_waits = 0  # submits that found the queue full and had to block
        self.reducer_runs = 0  # messages the reducer summed (0 without one)
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._run, name="sync-comm", daemon=True)
        self._thread.start()

    def submit(self, tensor: torch.Tensor, layers: tuple[str, ...]) -> PendingSync:
        """Queue ``tensor`` for an in-place all-reduce SUM over the group."""
        pending = PendingSync(tensor, layers)
        try:
            self._queue.put_nowait(pending)
        except queue.Full:
            self.full_waits += 1
            self._queue.put(pending, timeout=self.submit_timeout_s)
        return pending

    def close(self, timeout_s: float = 10.0) -> None:
        self._queue.put(_STOP, timeout=timeout_s)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            pending = self._queue.get()
            if pending is _STOP:
                return
            pending.picked_at = time.monotonic()
            try:
                link = self.link  # read once: tests swap it between windows
                stall = link.stall_s(pending.layers)
                if stall > 0:
                    time.sleep(stall)
                wire = link.wire_s(pending.tensor.numel() * pending.tensor.element_size())
                pending.on_wire_at = self.wire.occupy(wire, self.priority) if wire > 0 else time.monotonic()
                pending.launched_at = time.monotonic()
                if self.reducer is not None:
                    self.reducer(pending.tensor)
                    self.reducer_runs += 1
                    pending._mark_done()
                else:
                    work = dist.all_reduce(pending.tensor, group=self.group, async_op=True)
                    pending._work = work
                    work.get_future().add_done_callback(lambda _fut, p=pending: p._mark_done())
            except BaseException as error:  # handed to the waiter; the thread keeps serving
                pending._error = error
            pending._launched.set()
