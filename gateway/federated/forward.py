"""RawForwarder: in mode "upload raw", the training samples themselves go up, as records of the uplink log.

It copies the sample records of the private data log, byte for byte, into the uplink log (the same
``event`` records with a ``TrainingSample`` body that the trainer reads), flushes them durably, wakes
the uplink, and only then moves its cursor (``<dir>/forwarded.json``: the data log's id and the last
LSN copied, written atomically). So a sample reaches the cloud at least once: a crash between the
flush and the cursor write sends the last batch again (the cloud stores it twice; counted nowhere,
harmless for centralised training). The data log is never trimmed here: if the choice turns to
"train locally" the trainer still finds every sample.

Invariant: the cursor never passes a record that is not durable in the uplink log; a full uplink log
stops the pass (counted in ``uplink_full``) and the next pass retries from the cursor; ``failing``
says what stopped the last pass (None once one went through), which the training service reports as
``degraded``. No torch.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path

from gateway.storage.interface import LogCorrupted, LogFull, RecordLog
from protocol.federated import SAMPLE_EVENT_TYPE
from runtime.files import atomic_write
from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SAMPLE_MARK = f'"type":"{SAMPLE_EVENT_TYPE}"'.encode()


def write_cursor(path: Path, log_id: str, lsn: int) -> None:
    atomic_write(path, json.dumps({"v": 1, "log_id": log_id, "lsn": lsn}).encode())


def read_cursor(path: Path, log_id: str) -> int:
    """The last LSN copied from the log named ``log_id``; 0 if none (or the cursor is for another log)."""
    try:
        data = json.loads(path.read_text())
        return int(data["lsn"]) if data.get("log_id") == log_id else 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0


class RawForwarder:
    def __init__(
        self,
        data_log: RecordLog,
        uplink_log: RecordLog,
        cursor_path: Path,
        *,
        wake_uplink: Callable[[], None] | None = None,
        batch: int = 256,
        interval_s: float = 1.0,
    ) -> None:
        self._data_log, self._uplink_log = data_log, uplink_log
        self.cursor_path = cursor_path
        self._log_id = str(getattr(data_log, "log_id", "") or "")
        self.cursor = read_cursor(cursor_path, self._log_id)
        self._wake_uplink = wake_uplink
        self.batch, self.interval_s = batch, interval_s
        self._task: asyncio.Task[None] | None = None
        self.counters = {"forwarded": 0, "forwarded_bytes": 0, "passes": 0, "uplink_full": 0, "errors": 0}
        self.last_error: str | None = None
        self.failing: str | None = None  # why the last pass failed; None once a pass succeeded

    @property
    def running(self) -> bool:
        return self._task is not None

    async def start(self) -> None:
        if self._task is None:
            self.last_error = self.failing = None  # a new run: what failed before is not its error
            self._task = asyncio.create_task(self._run(), name="federated-raw-forwarder")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            try:
                copied = await self.forward_once()
            except Exception as exc:  # the loop must survive a failing log; say so and retry later
                self.counters["errors"] += 1
                self.last_error = self.failing = f"{type(exc).__name__}: {exc}"
                log.warning("raw forwarder: %s", self.last_error)
                copied = 0
            if copied < self.batch:  # caught up (or blocked): wait; otherwise go on at once
                await asyncio.sleep(self.interval_s)

    async def forward_once(self) -> int:
        """Copy up to ``batch`` sample records after the cursor; returns how many were copied."""
        self.counters["passes"] += 1
        start = max(self.cursor, self._data_log.trimmed_lsn) + 1
        copied, nbytes, last = 0, 0, self.cursor
        failing = None
        try:
            async for lsn, data in self._data_log.read(start):
                if copied >= self.batch:
                    break
                if SAMPLE_MARK in data:
                    await self._uplink_log.append(data)
                    copied += 1
                    nbytes += len(data)
                last = lsn
        except LogFull:
            self.counters["uplink_full"] += 1
            self.last_error = failing = "uplink log full: raw samples wait in the private log"
        except LogCorrupted as exc:  # copied so far stays copied; nothing past the damage goes
            self.last_error = failing = f"private log damaged: {exc}"
        self.failing = failing
        if last == self.cursor:
            return 0
        if copied:
            await self._uplink_log.flush(wait=True)  # durable before the cursor moves past them
            if self._wake_uplink is not None:
                self._wake_uplink()
        await asyncio.to_thread(write_cursor, self.cursor_path, self._log_id, last)
        self.cursor = last
        self.counters["forwarded"] += copied
        self.counters["forwarded_bytes"] += nbytes
        return copied
