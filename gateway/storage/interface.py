"""The log interface the gateway's ingest and uplink use, whatever log implements it.

Contract (every implementation, checked by tests/gateway/test_log_contract.py):
- ``append`` assigns strictly increasing LSNs (from 1, never reused within one ``log_id``) and
  never waits for the disk; it raises ``LogFull`` when the byte budget says so (policy "reject").
- ``flush`` closes the open epoch and returns it at once; awaiting the epoch completes when it
  and every earlier epoch are durable. ``flush(wait=True)`` does both.
- ``durable_lsn``: every record with LSN <= durable_lsn survives a crash.
- ``read(from_lsn)`` yields durable, not-trimmed records in LSN order, stopping at durable_lsn.
- ``trim(upto_lsn)`` releases records the cloud acknowledged; trimmed LSNs are never read again,
  also after a restart.
- A fatal disk error (a failed fsync) raises ``LogFailed``; it is never retried.
- What a full log does is its policy (docs/storage.md, "Full log"); a log that drops records
  reports the LSN runs it lost unacknowledged (``gaps``, counted exactly with the uplink's
  ``set_unacked_view``) until the uplink has written a LogGap record for them (``gaps_recorded``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

Lsn = int


class LogFull(Exception):
    """The byte budget is used up and the policy is to reject new records."""


class LogFailed(Exception):
    """The disk failed under the log (e.g. fsync returned an error); the log must be reopened."""


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

    def set_unacked_view(self, unacked: Callable[[Lsn, Lsn], list[tuple[Lsn, Lsn]]]) -> None: ...

    @property
    def gaps(self) -> list[tuple[Lsn, Lsn]]: ...

    async def gaps_recorded(self, runs: list[tuple[Lsn, Lsn]]) -> None: ...

    async def add_lost(self, runs: list[tuple[Lsn, Lsn]]) -> None: ...

    def stats(self) -> dict[str, int]: ...
