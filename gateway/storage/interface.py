"""The log interface the gateway's ingest and uplink use, whatever log implements it.

Contract (every implementation, checked by tests/gateway/test_log_contract.py):
- ``append`` assigns strictly increasing LSNs (from 1) and never waits for the disk; it raises
  ``LogFull`` when the byte budget says so (policy "reject"), and ``RecordTooLarge`` (a ``LogFull``)
  for a record no read could return or no budget could hold, before anything is written or dropped.
- An LSN that was ever durable is never assigned again within one ``log_id``, whatever a recovery
  cuts (a record appended but lost in a crash before it was durable may see its LSN again).
- ``flush`` closes the open epoch and returns it at once; awaiting the epoch completes when it
  and every earlier epoch are durable. ``flush(wait=True)`` does both.
- ``durable_lsn``: every record with LSN <= durable_lsn survives a crash, unless damage a crash
  cannot cause (a flipped bit, a lost file) hits it; such damage is reported, never skipped.
- ``read(from_lsn)`` yields durable, not-trimmed records in LSN order, stopping at durable_lsn; it
  verifies everything it returns, and where it reaches damage it raises ``LogCorrupted`` (after
  yielding the records before it), every time it reaches it.
- ``trim(upto_lsn)`` releases records the cloud acknowledged; once it has returned, trimmed LSNs
  are never read again, also after a restart. It either persists or raises ``TrimFailed``.
- A fatal disk error (a failed fsync, of any file) raises ``LogFailed``; it is never retried.
- ``verify()`` reads every record the log holds and reports all the damage it finds; ``damage``
  lists every damage found so far (at recovery, by a read, by ``verify``) and not trimmed away.
- What a full log does is its policy (docs/storage.md, "Full log"); a log that drops records
  reports the LSN runs it lost unacknowledged (``gaps``, counted exactly with the uplink's
  ``set_unacked_view``) until the uplink has written a LogGap record for them (``gaps_recorded``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Generator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

Lsn = int


class LogFull(Exception):
    """The byte budget is used up and the policy is to reject new records."""


class RecordTooLarge(LogFull):
    """This record can never go in (over the readable limit, or over the whole byte budget); nothing
    was written or dropped for it. A ``LogFull``, so every caller already refuses it."""


class LogFailed(Exception):
    """The disk failed under the log (e.g. fsync returned an error); the log must be reopened."""


class TrimFailed(Exception):
    """The trim point could not be made durable (e.g. ENOSPC writing it); ``trimmed_lsn`` is what is
    durable. Nothing is lost: the records stay until a later trim persists."""


@dataclass(frozen=True)
class Damage:
    """Where the bytes of a log stop being what was written. ``kind`` "torn" is what a crash leaves
    (cut silently at recovery); "corrupt" is what a crash cannot cause (reported, never skipped).
    ``lsn``: the first LSN that cannot be read because of it (0: not known)."""

    kind: Literal["torn", "corrupt"]
    segment: str
    offset: int
    detail: str
    lsn: Lsn = 0

    def __str__(self) -> str:
        at = f", from lsn {self.lsn}" if self.lsn else ""
        return f"{self.kind} at {self.segment} byte {self.offset}{at}: {self.detail}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class LogCorrupted(Exception):
    """A read reached damage: records from ``damage.lsn`` on cannot be read past it."""

    def __init__(self, damage: Damage) -> None:
        super().__init__(str(damage))
        self.damage = damage


@dataclass
class VerifyReport:
    """What one ``verify()`` pass read and found: every damage, not only the first."""

    started_ts: float
    seconds: float = 0.0
    segments: int = 0
    bytes: int = 0
    records: int = 0
    damage: list[Damage] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "started_ts": self.started_ts,
            "seconds": round(self.seconds, 3),
            "segments": self.segments,
            "bytes": self.bytes,
            "records": self.records,
            "mb_per_s": round(self.mb_per_s, 1),
            "damage": [d.as_dict() for d in self.damage],
        }


@dataclass
class Epoch:
    """A closed flush epoch. ``await epoch`` returns when it and every earlier epoch are durable."""

    number: int
    last_lsn: Lsn
    durable: asyncio.Future[None] = field(repr=False)

    def __await__(self) -> Generator[Any, None, None]:
        return asyncio.shield(self.durable).__await__()


class RecordLog(Protocol):
    log_id: str

    @property
    def durable_lsn(self) -> Lsn: ...

    @property
    def trimmed_lsn(self) -> Lsn: ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def append(self, record: bytes) -> Lsn: ...

    async def flush(self, wait: bool = False) -> Epoch: ...

    def read(self, from_lsn: Lsn) -> AsyncIterator[tuple[Lsn, bytes]]: ...

    async def trim(self, upto_lsn: Lsn) -> None: ...

    async def verify(self) -> VerifyReport: ...

    @property
    def damage(self) -> list[Damage]: ...

    def set_unacked_view(self, unacked: Callable[[Lsn, Lsn], list[tuple[Lsn, Lsn]]]) -> None: ...

    @property
    def gaps(self) -> list[tuple[Lsn, Lsn]]: ...

    async def gaps_recorded(self, runs: list[tuple[Lsn, Lsn]]) -> None: ...

    async def add_lost(self, runs: list[tuple[Lsn, Lsn]]) -> None: ...

    def stats(self) -> dict[str, int]: ...
