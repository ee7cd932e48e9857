"""AsyncStoreWriter: the one thread that does the store's blocking work for cloudd's event loop.

Owns a ``ThreadPoolExecutor``: opening (recovery), every write and the status reads run on it,
so the loop never waits for a disk. On SQLite it has one thread, so writes are serialised; on
PostgreSQL ``SHARED_WRITER_THREADS``, since batches of different gateways may commit at once there
(each holds its own gateway's lock: cloud/store/dataset.py).
Reads of the charts, the alerts and the counts (``read``, ``counts``) run on threads of their own:
a reader connection sees committed batches only, so they need not queue behind the writes. Invariant: at most
``max_pending`` calls are queued or running here; one more is refused at once with
``StoreBusy`` (counted in ``busy_rejections``) instead of queueing without bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from cloud.store.database import Conn
from cloud.store.dataset import DatasetStore, StoreCounts
from cloud.store.segments import DEFAULT_SEGMENT_MAX_BYTES
from protocol.batch import BatchAck, UploadBatch

T = TypeVar("T")
SHARED_WRITER_THREADS = 4  # at most the database pool's size less room for readers


class StoreBusy(Exception):
    """Too many store calls are waiting; the caller should retry later."""


class AsyncStoreWriter:
    def __init__(
        self,
        data_dir: Path,
        *,
        database: str | None = None,
        max_pending: int = 64,
        segment_max_bytes: int = DEFAULT_SEGMENT_MAX_BYTES,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.database = database  # a PostgreSQL URL; None: the data directory's SQLite file
        self.max_pending = max_pending
        self.segment_max_bytes = segment_max_bytes
        self.busy_rejections = 0
        self._pending = 0
        self._executor: ThreadPoolExecutor | None = None
        self._store: DatasetStore | None = None

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def store(self) -> DatasetStore:
        if self._store is None:
            raise RuntimeError("AsyncStoreWriter is not open")
        return self._store

    async def open(self) -> None:
        if self._executor is not None:
            raise RuntimeError("AsyncStoreWriter is already open")
        threads = 1 if self.database is None else SHARED_WRITER_THREADS
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="store-writer")
        try:
            self._store = await self._run(
                lambda: DatasetStore.open(
                    self.data_dir, database=self.database, segment_max_bytes=self.segment_max_bytes
                )
            )
        except BaseException:
            self._executor.shutdown(wait=True)
            self._executor = None
            raise

    async def close(self) -> None:
        """Let queued calls finish (they may be writes already promised to nobody), then close."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        store, self._store = self._store, None
        # Every queued call first (on PostgreSQL several run at once), then the store they use.
        await asyncio.to_thread(executor.shutdown, wait=True)
        if store is not None:
            await asyncio.to_thread(store.close)

    async def store_batch(self, batch: UploadBatch) -> BatchAck:
        return await self._run(lambda: self.store.store_batch(batch))

    async def counts(self) -> StoreCounts:
        """The counts for the status and fleet pages, a read (``read``): with the queue full of
        uploads, the fleet page must still answer (it got 500 ``StoreBusy`` under the fleet
        bench's thousand gateways when counts queued with the writes)."""
        return await asyncio.to_thread(self.store.counts)

    async def read(self, query: Callable[[Conn], T]) -> T:
        """A read on a thread of its own (readers never wait behind the writes queued here)."""
        return await asyncio.to_thread(self.store.read, query)

    async def write(self, change: Callable[[Conn], T]) -> T:
        """An operator's write (acknowledging alerts), queued with the batches."""
        return await self._run(lambda: self.store.write(change))

    async def _run(self, fn: Callable[[], T]) -> T:
        if self._executor is None:
            raise RuntimeError("AsyncStoreWriter is not open")
        if self._pending >= self.max_pending:
            self.busy_rejections += 1
            raise StoreBusy(f"{self._pending} store calls pending (limit {self.max_pending})")
        self._pending += 1
        future = asyncio.get_running_loop().run_in_executor(self._executor, fn)
        # Counted until the thread is done with it, even when the caller gave up waiting.
        future.add_done_callback(self._done)
        # Not cancelled with the caller: a write that started finishes, and a replay dedupes it.
        return await asyncio.shield(future)

    def _done(self, future: asyncio.Future[Any]) -> None:
        self._pending -= 1
        if not future.cancelled():
            future.exception()  # retrieved here, so a caller that gave up leaves no warning behind
