"""TaskRunner: cloudd runs the tasks a gateway's placement plan gave the cloud (docs/placement.md,
"Executing the plan"; docs/cloud.md, "Task runner").

One asyncio task, owned here (``start`` / ``stop``), at once when an upload stored records or
committed a blob (``wake``, called by the ingest and blob routes), else every ``poll_interval_s``:
1. follows each gateway's dataset segments from where it stopped (``DatasetStore.read_from``), and
   offers every record of a gateway log to that log's ``LogReplay`` (the logs this runner writes
   itself, ``derived_log_id(log_id, task)``, are skipped); reads them again from where a full buffer
   left a record out when a log stops at it (cloud/tasks/replay.py);
2. advances each log over its contiguous LSNs, which makes sensor results and camera summaries;
3. infers the waiting ``FrameForCloud`` records whose blob has arrived (one worker thread), and
   fails those whose blob has not come ``blob_wait_s`` after the runner first saw them;
4. stores the results (cloud/tasks/results.py), each as a record of kind ``"event"`` under
   ``(gateway, derived_log_id(log_id, task))`` at its input's LSN, so making it twice stores it
   once and it shows in the gateway's datasets like the events the gateway sends;
5. saves the cursors (cloud/tasks/cursor.py).

Steps 1-3 run gateway by gateway: an error in one gateway's work sends only that gateway back to
its saved cursors; an error elsewhere in the pass sends every gateway back.

Invariant: a cursor is saved only after every result made below its ``next_lsn`` is stored (a
store still refusing after ``store_busy_tries`` ends the pass before the save, and the next pass
makes them again), so no result is lost by a crash or a busy store, and none is stored twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cloud.registry import ModelRegistry
from cloud.store.blobs import BlobStore
from cloud.store.dataset import DatasetStore, StoredRecord
from cloud.store.writer import AsyncStoreWriter
from cloud.tasks.camera import CAMERA_TASK, BlobNotYet, Failed, FrameInference, Made, failure_body
from cloud.tasks.cursor import LogCursor, load_cursors, save_cursors
from cloud.tasks.replay import LogReplay, Position
from cloud.tasks.results import ResultWriter, StoreStillBusy
from cloud.tasks.sensor import AGGREGATE_TASK, DETECT_TASK, Result
from protocol.derived import FrameForCloud, derived_log_id
from runtime.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

RESULT_TASKS = (AGGREGATE_TASK, DETECT_TASK, CAMERA_TASK)  # the tasks whose results are stored here
COUNTERS = ("passes", "pass_errors", "gateway_errors", "rescans", "wakeups")


@dataclass(frozen=True)
class TaskRunnerConfig:
    poll_interval_s: float = 0.5
    read_chunk: int = 5000  # records read from the store per call
    max_buffered: int = 50_000  # per log: records held ahead of a hole
    model_cache: int = 4  # model versions kept loaded
    blob_wait_s: float = 600.0  # a frame whose blob is not committed this long after it was seen fails
    store_busy_tries: int = 8  # refusals of one batch of results before the pass ends
    store_busy_backoff_s: tuple[float, float] = (0.05, 2.0)  # the first wait after a refusal, the longest


class TaskRunner:
    def __init__(
        self,
        writer: AsyncStoreWriter,
        blobs: BlobStore,
        registry: ModelRegistry | None,
        *,
        data_dir: Path,
        factory_dir: Path,
        config: TaskRunnerConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.writer = writer
        self.config = config or TaskRunnerConfig()
        self.clock = clock
        self.cursor_dir = Path(data_dir) / "tasks"
        self.inference = FrameInference(blobs, registry, factory_dir, cache_size=self.config.model_cache)
        self.results = ResultWriter(
            writer,
            RESULT_TASKS,
            busy_tries=self.config.store_busy_tries,
            busy_backoff_s=self.config.store_busy_backoff_s,
        )
        self._logs: dict[tuple[str, str], LogReplay] = {}
        self._derived: set[str] = set()  # the log ids this runner writes to
        self._positions: dict[str, Position] = {}  # gateway -> where its reading goes on
        self._lag: dict[tuple[str, str], int] = {}
        self._saved: list[LogCursor] = []  # what the cursor file holds
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._executor: ThreadPoolExecutor | None = None
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("TaskRunner already started")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cloud-tasks")
        await asyncio.to_thread(self._reset)
        self._task = asyncio.create_task(self._run(), name="cloud-tasks")

    async def stop(self) -> None:
        """Cancel the loop (a pass stops between steps; its cursor was not saved, so the next start
        makes its results again), then end the worker thread."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True)

    async def _run(self) -> None:
        while True:
            self._wake.clear()  # before the pass: what arrives during it starts the next one at once
            try:
                await self.run_pass()
            except Exception:
                self.counters["pass_errors"] += 1
                log.exception("cloud task pass failed: resuming from the saved cursors")
                await asyncio.to_thread(self._reset)
            if await wait_event(self._wake, self.config.poll_interval_s):
                self.counters["wakeups"] += 1

    def wake(self) -> None:
        """New records or a committed blob: run a pass now rather than at the next poll."""
        self._wake.set()

    def _reset(self) -> None:
        """Forget what this process made since the cursors were last saved and read every gateway
        again: the results made since are made again (and stored once)."""
        self._logs.clear()
        self._positions.clear()
        self._saved = list(load_cursors(self.cursor_dir, now=self.clock()).values())
        for cursor in self._saved:
            self._add_log(cursor)

    def _forget(self, gateway: str) -> None:
        """``_reset`` for one gateway: its logs go back to their saved cursors and its segments are
        read again from the start; every other gateway keeps its place."""
        saved = {(c.gateway, c.log_id): c for c in self._saved}
        for key in [key for key in self._logs if key[0] == gateway]:
            self._add_log(saved.get(key, LogCursor(*key)))
        self._positions.pop(gateway, None)

    # -- one pass -------------------------------------------------------------------------------

    async def run_pass(self) -> None:
        """One pass over every gateway. A gateway whose work fails is forgotten back to its saved
        cursors (the others go on); a store still busy after its tries ends the pass before the save."""
        self.counters["passes"] += 1
        store = self.writer.store
        counts = await asyncio.to_thread(store.counts)
        for gateway in (g.id for g in counts.gateways):
            try:
                await self._follow(store, gateway)
                await self._infer_waiting(gateway)
            except StoreStillBusy as exc:
                log.warning("cloud tasks: %s; the next pass makes %s's results again", exc, gateway)
                self._forget(gateway)
                return
            except Exception:
                self.counters["gateway_errors"] += 1
                log.exception("cloud tasks of gateway %s failed: resuming it from its saved cursors", gateway)
                self._forget(gateway)
        await asyncio.to_thread(self._measure_lag, store)
        cursors = [r.cursor() for r in self._logs.values()]
        if cursors != self._saved:  # an fsync per pass only when something moved
            await asyncio.to_thread(save_cursors, self.cursor_dir, cursors)
            self._saved = cursors

    async def _follow(self, store: DatasetStore, gateway: str) -> None:
        """Read ``gateway``'s segments to their end, and again from where a record was left out
        whenever a log stops at it (each time, that log processes at least its next LSN)."""
        while True:
            start = self._positions.get(gateway, (0, 0))
            records, position = await asyncio.to_thread(
                store.read_from, gateway, start, self.config.read_chunk
            )
            touched: set[LogReplay] = set()
            for stored in records:
                replay = self._replay_for(stored)
                if replay is not None:
                    replay.offer(stored.lsn, stored.record, start)
                    touched.add(replay)
            for replay in touched:
                await self._store(replay, replay.advance())
            self._positions[gateway] = position
            if len(records) < self.config.read_chunk and not self._rescan(gateway):
                return

    def _rescan(self, gateway: str) -> bool:
        """Whether a log of ``gateway`` stopped where it may have left a record out; if so, read
        the segments again from the earliest position any of its logs left a record out at."""
        logs = [r for (gw, _), r in self._logs.items() if gw == gateway and r.left_out is not None]
        if not any(r.needs_rescan for r in logs):
            return False
        self._positions[gateway] = min(r.left_out.read_at for r in logs if r.left_out is not None)
        for replay in logs:
            replay.rescanned()
        self.counters["rescans"] += 1
        return True

    def _replay_for(self, stored: StoredRecord) -> LogReplay | None:
        if stored.log_id in self._derived:
            return None
        key = (stored.gateway, stored.log_id)
        replay = self._logs.get(key)
        if replay is None:
            replay = self._add_log(LogCursor(stored.gateway, stored.log_id))
        return replay

    def _add_log(self, cursor: LogCursor) -> LogReplay:
        replay = LogReplay(cursor, max_buffered=self.config.max_buffered, clock=self.clock)
        self._logs[(cursor.gateway, cursor.log_id)] = replay
        self._derived.update(derived_log_id(cursor.log_id, task) for task in RESULT_TASKS)
        return replay

    async def _infer_waiting(self, gateway: str) -> None:
        """Infer the frames of ``gateway`` whose blob has arrived; fail those that waited
        ``blob_wait_s`` for it in vain (the gateway sends a record without its blob when it lost it)."""
        for replay in [r for (gw, _), r in self._logs.items() if gw == gateway]:
            for lsn, waiting in sorted(replay.waiting.items()):
                frame = FrameForCloud.model_validate(waiting.body)
                outcome = await self._in_worker(self.inference.infer, replay.gateway, lsn, frame)
                if isinstance(outcome, BlobNotYet):
                    waited = self.clock() - waiting.first_seen
                    if waited < self.config.blob_wait_s:
                        continue
                    outcome = Failed(
                        "blob_missing", f"blob {outcome.blob_id} not committed after {waited:.0f} s"
                    )
                if isinstance(outcome, Made):
                    body = outcome.event.model_dump(mode="json")
                else:
                    body = self._failed(replay, lsn, frame, outcome)
                await self._store(replay, [Result(CAMERA_TASK, lsn, waiting.device, body)])
                del replay.waiting[lsn]

    def _failed(self, replay: LogReplay, lsn: int, frame: FrameForCloud, failed: Failed) -> dict[str, Any]:
        log.error("%s/%s lsn %d: camera/infer failed: %s", replay.gateway, replay.log_id, lsn, failed.detail)
        return failure_body(
            failed.reason, failed.detail, task="camera/infer", input_lsn=lsn, source=frame.source
        )

    async def _in_worker(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _store(self, replay: LogReplay, results: list[Result]) -> None:
        await self.results.store(replay.gateway, replay.log_id, results)

    def _measure_lag(self, store: DatasetStore) -> None:
        for key, replay in self._logs.items():
            ranges = store.stored_ranges(*key)
            self._lag[key] = sum(max(0, hi - max(lo, replay.next_lsn) + 1) for lo, hi in ranges)

    # -- what it shows --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The ``tasks`` part of /v1/status. A log's ``next_lsn`` is its saved cursor's: every
        result made below it is stored; ``reading_lsn`` is where its replay is."""
        saved = {(c.gateway, c.log_id): c for c in self._saved}
        return {
            "made": dict(self.results.made),
            "failures": dict(self.results.failures),
            "waiting_blobs": sum(len(r.waiting) for r in self._logs.values()),
            "lag_records": sum(self._lag.values()),
            "model_loads": self.inference.loads,
            **self.counters,
            **self.results.counters,
            "logs": [
                {
                    "gateway": gw,
                    "log_id": log_id,
                    "next_lsn": saved[(gw, log_id)].next_lsn if (gw, log_id) in saved else 1,
                    "reading_lsn": replay.next_lsn,
                    "buffered": replay.buffered,
                    "waiting_blobs": len(replay.waiting),
                    "lag_records": self._lag.get((gw, log_id), 0),
                    **replay.counters,
                    **replay.sensor.counters,
                }
                for (gw, log_id), replay in sorted(self._logs.items())
            ],
        }

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(_TaskCollector(self))


class _TaskCollector(Collector):
    """The runner's counters as Prometheus metrics, read when scraped (one source of truth)."""

    def __init__(self, runner: TaskRunner) -> None:
        self.runner = runner

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        status = self.runner.status()
        made = CounterMetricFamily("cloudd_task_results", "Results the cloud's tasks made", labels=["task"])
        for task, n in status["made"].items():
            made.add_metric([task], n)
        yield made
        failed = CounterMetricFamily(
            "cloudd_task_failures", "Inputs a cloud task could not process", labels=["reason"]
        )
        for reason, n in status["failures"].items():
            failed.add_metric([reason], n)
        yield failed
        yield GaugeMetricFamily(
            "cloudd_task_waiting_blobs", "Frames waiting for their blob", value=status["waiting_blobs"]
        )
        yield GaugeMetricFamily(
            "cloudd_task_lag_records", "Stored records not yet processed", value=status["lag_records"]
        )
