"""EpochLog's room for appends: the bounded buffer, the byte budget and what a full log does.

Part of ``EpochLog`` (a mixin: the state is the log's, listed below; ``EpochLog.__init__`` sets it),
kept apart because it is one concern: whether an append may go ahead, and at what cost.

Full policies (docs/storage.md, "Full log"): "reject" raises LogFull; "drop_oldest" drops the oldest
segment, counting exactly the records in it the cloud had not acknowledged (``set_unacked_view``)
and keeping them as pending gaps (``gaps`` / ``gaps_recorded``) in the drop ledger (drops.py) until
a LogGap record names them; "hold" makes ``append`` wait until a trim frees room (the caller stops
taking input meanwhile).

Invariant: an append goes ahead only when its bytes fit the budget (``bytes_used + size <=
max_bytes``, the disk not known full) and the buffer (``buffered + size <= buffer_bytes``, or the
buffer is empty); a drop's loss is in the ledger file before the trim that makes it durable.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from gateway.storage.drops import DROPS_FILE, DropLedger, Run
from gateway.storage.durable_files import replace_durably
from gateway.storage.filelayer import FileLayer
from gateway.storage.interface import Epoch, LogFailed, LogFull, Lsn
from gateway.storage.log_format import SEGMENT_HEADER_BYTES
from gateway.storage.recovery import SegmentInfo
from runtime.tasks import wait_event

log = logging.getLogger(__name__)

# Declared again in protocol.config, which validates the setting: the log does not import the config
# schema (pydantic), so that a process that only writes or recovers a log starts fast.
FullPolicy = Literal["reject", "drop_oldest", "hold"]
HOLD_REPORT_S = 30.0  # a held append logs again after waiting this long for room


class LogBudget:
    # The log's state these methods read and change.
    directory: str
    max_bytes: int
    full_policy: FullPolicy
    buffer_bytes: int
    append_timeout_s: float
    _layer: FileLayer
    _segments: list[SegmentInfo]
    _open_chunks: list[bytes]
    _active_bytes: int
    _durable_lsn: Lsn
    _trimmed_lsn: Lsn
    _buffered: int
    _bytes_used: int
    _disk_full: bool
    _space: asyncio.Event
    _room_lock: asyncio.Lock
    _room_freed: asyncio.Event
    _holding: int
    _failed: BaseException | None
    _closed: bool
    _ledger: DropLedger
    _unacked: Callable[[Lsn, Lsn], list[Run]]
    _stats: dict[str, int]

    if TYPE_CHECKING:  # EpochLog's methods, used here

        async def flush(self, wait: bool = False) -> Epoch: ...
        def _close_epoch(self) -> None: ...
        def _new_segment(self) -> None: ...
        async def _persist_trim(self, upto_lsn: Lsn) -> None: ...
        async def _on_admin(self, call: Callable[..., Any], *args: Any) -> Any: ...

    async def _wait_for_space(self, size: int) -> None:
        """The buffer is full: close the open epoch early (a finer split keeps the prefix guarantee)
        and wait, at most append_timeout_s, for the writer to make room."""
        self._stats["buffer_waits"] += 1
        self._close_epoch()
        deadline = time.monotonic() + self.append_timeout_s
        while self._buffered + size > self.buffer_bytes and self._buffered > 0:
            if self._failed is not None:
                raise LogFailed(str(self._failed))
            self._space.clear()
            if not await wait_event(self._space, max(0.0, deadline - time.monotonic())):
                self._stats["rejected_records"] += 1
                raise LogFull(
                    f"buffer of {self.buffer_bytes} bytes still full after "
                    f"{self.append_timeout_s}s: the disk is not keeping up"
                ) from None

    async def _make_room(self, size: int) -> None:
        async with self._room_lock:
            while self._bytes_used + size > self.max_bytes or self._disk_full:
                if self.full_policy == "hold":
                    if len(self._segments) < 2:  # a trim frees whole segments, never the active one
                        await self._seal_oldest()
                    await self._hold_for_room()
                elif self.full_policy == "reject" or not await self._drop_oldest():
                    self._stats["rejected_records"] += 1
                    raise LogFull(
                        f"epoch log {self.directory}: {self._bytes_used} of {self.max_bytes} bytes "
                        f"used{' and the disk is full' if self._disk_full else ''}"
                    )
                self._disk_full = False  # re-raised by the writer if its retry still finds no space

    async def _hold_for_room(self) -> None:
        """Policy "hold": wait until a trim frees bytes (the caller's loop checks again; a wait that
        times out is reported, and checks again too: a full disk may have cleared)."""
        self._stats["hold_waits"] += 1
        self._holding += 1
        try:
            self._room_freed.clear()
            if not await wait_event(self._room_freed, HOLD_REPORT_S):
                log.warning(
                    "epoch log %s: full for %.0fs, policy hold: appends wait for the uplink to trim",
                    self.directory,
                    HOLD_REPORT_S,
                )
        finally:
            self._holding -= 1
        if self._failed is not None or self._closed:
            raise LogFailed(f"epoch log {self.directory} is {'failed' if self._failed else 'closed'}")

    def set_unacked_view(self, unacked: Callable[[Lsn, Lsn], list[Run]]) -> None:
        """How a drop learns what it loses: ``unacked(first, last)`` returns the runs of [first, last]
        the cloud has not acknowledged (the uplink's view; by default all of them)."""
        self._unacked = unacked

    async def _drop_oldest(self) -> bool:
        """Drop the oldest whole segment that is durable and not the active one (counted loss)."""
        if len(self._segments) < 2 or self._segments[1].header.first_lsn - 1 > self._durable_lsn:
            await self._seal_oldest()
        if len(self._segments) < 2 or self._segments[1].header.first_lsn - 1 > self._durable_lsn:
            return False
        # everything up to the next segment goes: the oldest one, and a damaged one before it if any
        first, last = self._trimmed_lsn + 1, self._segments[1].header.first_lsn - 1
        lost = self._unacked(first, last) if first <= last else []
        self._ledger.add_drop(last, lost)
        # The ledger first: a crash before the trim below undoes this drop at recovery (DropLedger.settle).
        # On a full disk it can only be written once the trim has freed a segment.
        persisted = await self._persist_ledger()
        await self._persist_trim(last)
        if not persisted:
            await self._persist_ledger()
        log.warning(
            "epoch log %s: full: dropped %d un-uploaded records (lsn <= %d)",
            self.directory,
            sum(hi - lo + 1 for lo, hi in lost),
            last,
        )
        return True

    async def _seal_oldest(self) -> None:
        """Make the oldest segment droppable or trimmable: its records durable (the open epoch closed
        and waited for, at most append_timeout_s) and, if it is the only one, the next epoch in a new
        segment (one epoch may fill the whole budget: the intake appends a burst without yielding)."""
        epoch = await self.flush()
        try:
            async with asyncio.timeout(self.append_timeout_s):
                await epoch
        except (TimeoutError, LogFailed):
            return
        if len(self._segments) == 1 and not self._open_chunks and self._active_bytes > SEGMENT_HEADER_BYTES:
            self._new_segment()

    # -- the drop ledger -------------------------------------------------------------------------------

    def _load_ledger(self) -> None:
        data = self._layer.read_file(os.path.join(self.directory, DROPS_FILE))
        if data is None:
            return
        ledger = DropLedger.decode(data)
        if ledger is None:
            self._stats["corruptions"] += 1
            log.error("epoch log %s: %s is damaged; drop counts start again at 0", self.directory, DROPS_FILE)
            return
        ledger.settle(self._trimmed_lsn)
        self._ledger = ledger

    @property
    def gaps(self) -> list[Run]:
        """The LSN runs dropped unacknowledged that no LogGap record names yet, ascending."""
        return list(self._ledger.gaps)

    async def gaps_recorded(self, runs: list[Run]) -> None:
        """``runs`` (from ``gaps``) are now named by durable LogGap records: no longer pending."""
        self._ledger.recorded(runs)
        await self._persist_ledger()

    async def add_lost(self, runs: list[Run]) -> None:
        """Dropped records the last drops could not count (the uplink had them in flight, then failed)."""
        self._ledger.add_lost(runs)
        await self._persist_ledger()

    async def _persist_ledger(self) -> bool:
        """Write the drop ledger; False if the disk refused (e.g. ENOSPC: the next write retries)."""
        data = self._ledger.encode()
        try:
            await self._on_admin(replace_durably, self._layer, self.directory, DROPS_FILE, data)
        except OSError as exc:  # not a failed fsync: that fails the log
            self._stats["ledger_persist_failures"] += 1
            log.warning("epoch log %s: drop ledger not persisted yet: %s", self.directory, exc)
            return False
        return True
