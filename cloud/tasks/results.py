"""ResultWriter: stores what cloudd's task runner made, through cloudd's ``AsyncStoreWriter``.

Each result is a record of kind ``"event"`` under ``(gateway, derived_log_id(log_id, task))`` at its
input's LSN, so making it twice stores it once. The store is shared with the uploads, which go
first: a ``StoreBusy`` refusal is retried with a backoff, at most ``busy_tries`` times; then
``StoreStillBusy`` ends the caller's pass (it has not saved its cursor, so the next pass makes the
results again). ``task_failed`` bodies go in batches of their own, so the store's ack says how many
of each were stored.

Invariant: ``store`` returns only once every result given to it is stored (now or before), else it
raises; ``made`` counts results the store took (a result made again is not counted again) and
``failures`` the ``task_failed`` bodies it took, by reason.
"""

from __future__ import annotations

import asyncio
import time

from cloud.store.writer import AsyncStoreWriter, StoreBusy
from cloud.tasks.sensor import Result
from protocol.batch import MAX_BATCH_RECORDS, BatchEntry, UploadBatch
from protocol.derived import derived_log_id
from protocol.records import Record
from runtime.backoff import Backoff

COUNTERS = ("stored", "store_busy", "store_gave_up")


class StoreStillBusy(Exception):
    """The store refused a batch of results ``busy_tries`` times in a row."""


class ResultWriter:
    def __init__(
        self,
        writer: AsyncStoreWriter,
        tasks: tuple[str, ...],
        *,
        busy_tries: int,
        busy_backoff_s: tuple[float, float],  # the first wait and the longest
    ) -> None:
        if busy_tries < 1:
            raise ValueError(f"busy_tries must be at least 1, got {busy_tries}")
        self.writer = writer
        self.busy_tries = busy_tries
        self.busy_backoff_s = busy_backoff_s
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.made: dict[str, int] = dict.fromkeys(tasks, 0)
        self.failures: dict[str, int] = {}

    async def store(self, gateway: str, log_id: str, results: list[Result]) -> None:
        """Store results made from ``(gateway, log_id)``: one batch per derived log and kind (a
        result, or a failure and its reason), LSNs increasing, each LSN once."""
        groups: dict[tuple[str, str | None], dict[int, Result]] = {}
        for result in results:
            failed = result.body.get("reason") if result.body.get("type") == "task_failed" else None
            groups.setdefault((result.task, failed), {})[result.lsn] = result
        now = time.time()
        for (task, failed), found in groups.items():
            entries = [
                BatchEntry(
                    lsn=lsn,
                    data=Record(kind="event", device=result.device, received_ts=now, body=result.body),
                )
                for lsn, result in sorted(found.items())
            ]
            derived = derived_log_id(log_id, task)
            for i in range(0, len(entries), MAX_BATCH_RECORDS):
                batch = UploadBatch(
                    v=1, gateway=gateway, log_id=derived, records=entries[i : i + MAX_BATCH_RECORDS]
                )
                stored = await self._store_batch(batch)
                self.counters["stored"] += stored
                if failed is None:
                    self.made[task] += stored
                else:
                    self.failures[failed] = self.failures.get(failed, 0) + stored

    async def _store_batch(self, batch: UploadBatch) -> int:
        """Store one batch, waiting while the store is busy, ``busy_tries`` times at most."""
        backoff = Backoff(*self.busy_backoff_s)
        while True:
            try:
                return (await self.writer.store_batch(batch)).stored
            except StoreBusy as exc:
                self.counters["store_busy"] += 1
                if backoff.failures + 1 >= self.busy_tries:
                    self.counters["store_gave_up"] += 1
                    raise StoreStillBusy(f"refused {self.busy_tries} times: {exc}") from None
                await asyncio.sleep(backoff.failed())
