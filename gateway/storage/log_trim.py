"""EpochLog's ``trim``: releasing what the cloud acknowledged, durably, a whole segment at a time.

Part of ``EpochLog`` (a mixin: the state is the log's, listed below). A trim deletes the segments
its trim point covers whole (oldest first, each deletion durable: durable_files.py), then writes the
trim point into META (meta.py). Deleting first is safe (those records are all trimmed) and is what
lets a trim free space on a full disk.

Invariant: once ``trim`` has returned, no LSN at or below the trim point is read again, also after
a crash: either META holds it, or ``trim`` raised ``TrimFailed`` and ``trimmed_lsn`` was put back to
what the disk holds (META's trim point, or the first segment left, from which recovery derives it).
A segment file whose header is damaged is deleted only once the trim point passes the first
readable segment after it (everything it can hold is trimmed then).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.storage.durable_files import unlink_in_order
from gateway.storage.filelayer import FileLayer
from gateway.storage.interface import Damage, Lsn, TrimFailed
from gateway.storage.meta import MetaFile
from gateway.storage.recovery import SegmentInfo, UnreadableSegment

log = logging.getLogger(__name__)


class LogTrimming:
    # The log's state these methods read and change.
    directory: str
    _layer: FileLayer
    _meta: MetaFile
    _segments: list[SegmentInfo]
    _unreadable: list[UnreadableSegment]
    _durable_lsn: Lsn
    _trimmed_lsn: Lsn
    _bytes_used: int
    _room_freed: asyncio.Event
    _damage: dict[tuple[str, int], Damage]
    _stats: dict[str, int]

    if TYPE_CHECKING:  # EpochLog's, used here

        async def _on_admin(self, call: Callable[..., Any], *args: Any) -> Any: ...

    async def trim(self, upto_lsn: Lsn) -> None:
        upto_lsn = min(upto_lsn, self._durable_lsn)
        if upto_lsn <= self._trimmed_lsn:
            return
        self._stats["trims"] += 1
        await self._persist_trim(upto_lsn)

    async def _persist_trim(self, upto_lsn: Lsn) -> None:
        """Delete the segments the trim frees, then make the trim point durable (module docstring)."""
        self._trimmed_lsn = max(self._trimmed_lsn, upto_lsn)
        freed = self._drop_trimmed_segments()
        if freed:
            await self._on_admin(self._unlink, freed)
            self._room_freed.set()
        try:
            await self._on_admin(self._meta.set_trimmed, self._trimmed_lsn)
        except OSError as exc:  # e.g. ENOSPC: keep to what the disk holds, and say so
            self._stats["trim_persist_failures"] += 1
            self._trimmed_lsn = self._durable_trim_point()
            if self._trimmed_lsn < upto_lsn:
                raise TrimFailed(
                    f"epoch log {self.directory}: trim to {upto_lsn} not persisted ({exc}); "
                    f"trimmed to {self._trimmed_lsn}"
                ) from exc

    def _durable_trim_point(self) -> Lsn:
        """The trim point a recovery would find now: META's, or just before the first segment left
        when the deletions went further (never past a damaged segment before it)."""
        point = self._meta.values.trimmed_lsn
        if self._segments and not self._damaged_before_first():
            point = max(point, self._segments[0].header.first_lsn - 1)
        return point

    def _damaged_before_first(self) -> bool:
        return any(u.seq < self._segments[0].header.seq for u in self._unreadable)

    def _unlink(self, paths: list[str]) -> None:
        unlink_in_order(self._layer, self.directory, paths)

    def _drop_trimmed_segments(self) -> list[str]:
        """Forget the segment files the trim point covers whole; their paths, oldest first, to delete."""
        freed: list[tuple[int, str, int]] = []
        while len(self._segments) > 1 and self._segments[1].header.first_lsn - 1 <= self._trimmed_lsn:
            gone = self._segments.pop(0)
            freed.append((gone.header.seq, gone.path, gone.size))
        first = self._segments[0].header if self._segments else None
        if first is not None and first.first_lsn - 1 <= self._trimmed_lsn:
            covered = [u for u in self._unreadable if u.seq < first.seq]
            self._unreadable = [u for u in self._unreadable if u.seq > first.seq]
            freed += [(u.seq, u.path, u.size) for u in covered]
        freed.sort()
        self._bytes_used -= sum(size for _, _, size in freed)
        paths = [path for _, path, _ in freed]
        self._damage = {
            key: d
            for key, d in self._damage.items()
            if d.segment not in paths and not 0 < d.lsn <= self._trimmed_lsn
        }
        return paths
