"""Roles one cloudd replica plays at a time (running training jobs, the cloud task runner), each
held by a lease on the metadata database (``Database.try_lease``: a PostgreSQL session advisory lock).

``Role.open`` tries the lease once; holding it, it starts the role's work. Not holding it, the
replica is a standby for that role: an owned task tries again every ``retry_s`` and starts the work
once the holder is gone (its process died or stopped, so the server ended its session and
released the lock). While held, the same task checks the lease's connection every ``retry_s``;
a lease found lost stops the work for good (the replica says so in its log and on
``GET /v1/roles``; restarting it makes it a standby again). On SQLite the lease is always this
process's (one cloudd per data directory), so every role starts at once, as before replicas.

Invariant: a role's work runs only while this process holds its lease: it starts after the lease
is taken and is stopped before the lease is closed. Docs: docs/cloud.md, "Replicas".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from cloud.store.database import Database, DatabaseError, Lease
from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class Role:
    def __init__(
        self,
        name: str,
        db: Database,
        start: Callable[[], Awaitable[None]],
        stop: Callable[[], Awaitable[None]],
        *,
        retry_s: float = 2.0,
    ) -> None:
        self.name, self.db, self.retry_s = name, db, retry_s
        self._start, self._stop = start, stop
        self._lease: Lease | None = None
        self._running = False
        self.lost = False  # the lease went away under us: the work was stopped for good
        self._watch: asyncio.Task[None] | None = None

    @property
    def held(self) -> bool:
        return self._running

    async def open(self) -> None:
        await self._try()
        if not self.db.shared:
            return  # SQLite: held at once, nothing to watch
        self._watch = asyncio.create_task(self._watch_lease(), name=f"role-{self.name}")

    async def _try(self) -> bool:
        try:
            lease = await asyncio.to_thread(self.db.try_lease, self.name)
        except DatabaseError as exc:
            log.warning("role %s: cannot ask for the lease: %s", self.name, exc)
            return False
        if lease is None:
            return False
        self._lease = lease
        try:
            await self._start()
        except BaseException:
            await asyncio.to_thread(lease.close)
            self._lease = None
            raise
        self._running = True
        if self.db.shared:  # on SQLite every role is the one cloudd's: nothing to tell
            log.info("role %s: this replica holds it", self.name)
        return True

    async def _watch_lease(self) -> None:
        while not self.lost:
            await asyncio.sleep(self.retry_s)  # the polling period of a standby: the scenario, not a wait
            if self._lease is None:
                try:
                    await self._try()
                except Exception:  # the work failed to start: a standby still, it asks again
                    log.exception("role %s: starting it failed", self.name)
            elif not await asyncio.to_thread(self._lease.alive):
                log.error("role %s: lost the lease (database connection gone); stopping it", self.name)
                self.lost = True
                await self._end()

    async def _end(self) -> None:
        running, self._running = self._running, False
        if running:
            await self._stop()
        lease, self._lease = self._lease, None
        if lease is not None:
            await asyncio.to_thread(lease.close)

    async def close(self) -> None:
        await cancel_and_wait(self._watch)
        self._watch = None
        await self._end()
