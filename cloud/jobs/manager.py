"""JobManager: cloudd's training jobs: a bounded queue scheduled by ``cloud.scheduler`` rounds over
the configured nodes (``TorchrunBackend``), one owner task per running job (``JobRunner``), state
persisted in ``JobTable``.

A round runs on every submission, every run's end and every ``round_interval_s``; its plan starts
jobs (torchrun on the nodes placement chose) and preempts them (the run's lease is revoked: the
trainer checkpoints at its next step boundary and exits; the job waits again as ``preempted`` with
its attained service and resumes from that checkpoint when a later round starts it). The owner
task tails ``progress.jsonl`` into the job's ``JobEvents``, between the manager's own ``state`` and
``phase`` events (``queued``, ``starting``, ``exporting``, ``evaluating``).

Invariants: a job is ``succeeded`` only after its model version is in the registry with its
evaluation (promotable or not: the gate decides where it may run, not whether it is kept);
submissions beyond ``max_queued`` waiting jobs are refused (``QueueFull``, counted in
``refused``), never silently dropped; at most ``max_running`` jobs run; ``stop()`` leaves no
torchrun behind (running jobs are stopped and go back to ``queued``, so the next cloudd resumes
them from their last complete checkpoint).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloud.jobs.backend import TorchrunBackend
from cloud.jobs.events import JobEvents, tail_lines
from cloud.jobs.runner import JobFailure, JobRunner, Preempted, Run
from cloud.jobs.scheduling import SchedulerSettings, scheduler_settings
from cloud.jobs.spec import JobSpec
from cloud.jobs.table import FINAL, WAITING, JobRow, JobState, JobTable
from cloud.jobs.torchrun import cancel_job
from cloud.jobs.uploads import UploadedDatasets
from cloud.registry import ModelRegistry
from cloud.rollout.verdict import GateConfig
from cloud.store.database import Database
from runtime.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """More jobs are waiting than ``max_queued``."""


class JobNotFound(KeyError):
    pass


class JobManager:
    def __init__(
        self,
        data_dir: Path,
        registry: ModelRegistry,
        *,
        uploads: UploadedDatasets | None = None,
        max_running: int = 1,
        max_queued: int = 16,
        gate: GateConfig | None = None,
        scheduler: SchedulerSettings | None = None,
        clock: Callable[[], float] = time.time,
        database: Database | None = None,  # the replicas' shared one; None: jobs/jobs.sqlite
    ) -> None:
        self.database = database
        self.data_dir, self.root = data_dir, data_dir / "jobs"
        self.clock = clock
        uploads = uploads or UploadedDatasets(data_dir / "uploads", max_bytes=0)
        self.runner = JobRunner(data_dir, registry, uploads, gate or GateConfig(), clock)
        self.settings = scheduler or scheduler_settings(default_devices=4)
        self.max_running, self.max_queued = max_running, max_queued
        self.refused = 0
        self.backend = TorchrunBackend(
            self.settings,
            lambda job_id: self.root / job_id,
            self._launch_owner,
            self._refused_by_admission,
            max_running=max_running,
            clock=clock,
        )
        self._table: JobTable | None = None
        self._events: dict[str, JobEvents] = {}
        self._owners: dict[str, asyncio.Task[None]] = {}
        self._cancelling: set[str] = set()
        self._wake = asyncio.Event()
        self._scheduler: asyncio.Task[None] | None = None
        self._stopping = False

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._table is not None:
            raise RuntimeError("JobManager already started")
        self._table = JobTable(self.root / "jobs.sqlite", self.database)
        for row in self._table.all("running"):  # cloudd stopped (or crashed) under it: resume it
            self._table.set_state(row.id, "queued", error="interrupted by a cloudd restart; resumes")
        for row in self._table.all():
            if row.state in WAITING:
                self.backend.add(row)
        self._scheduler = asyncio.create_task(self._schedule(), name="jobs-scheduler")

    async def stop(self) -> None:
        """Stop scheduling, stop running jobs (they go back to queued), close every stream."""
        self._stopping = True
        await cancel_and_wait(self._scheduler)
        for job_id, task in list(self._owners.items()):  # one at a time: each ends stopped or not started
            await cancel_and_wait(task)
            self._owners.pop(job_id, None)
        for events in self._events.values():
            events.close()
        if self._table is not None:
            self._table.close()
            self._table = None

    def close_streams(self) -> None:
        """Wake every event stream so that its handler returns (called when cloudd shuts down)."""
        self._stopping = True
        for events in self._events.values():
            events.close()

    @property
    def table(self) -> JobTable:
        if self._table is None:
            raise RuntimeError("JobManager is not started")
        return self._table

    # -- requests ----------------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> JobRow:
        if len(self.table.all("queued")) >= self.max_queued:
            self.refused += 1
            raise QueueFull(f"{self.max_queued} jobs are already waiting (--max-queued-jobs)")
        row = self.table.insert(json.loads(spec.model_dump_json()), self.clock())
        events = self._events[row.id] = JobEvents()
        events.extend([{"event": "phase", "phase": "queued", "time": row.created_ts}])
        self.backend.add(row)
        self._wake.set()
        return row

    def get(self, job_id: str) -> JobRow:
        row = self.table.get(job_id)
        if row is None:
            raise JobNotFound(job_id)
        return row

    # Below this method, ``list`` in this class body names it, not the builtin.
    def list(self) -> list[JobRow]:
        return self.table.all()

    def counts(self) -> dict[str, int]:
        rows = self.table.all()
        return {
            "running": sum(r.state == "running" for r in rows),
            "queued": sum(r.state == "queued" for r in rows),
            "preempted": sum(r.state == "preempted" for r in rows),
            "total": len(rows),
            "refused": self.refused,
        }

    async def cancel(self, job_id: str) -> JobRow:
        row = self.get(job_id)
        if row.state in WAITING:
            row = self.table.set_state(job_id, "cancelled", finished_ts=self.clock(), error="cancelled")
            self.backend.discard(job_id)
            self._end_stream(job_id, {"event": "state", "state": "cancelled", "time": row.finished_ts})
            self._wake.set()
            return row
        if row.state == "running":
            self._cancelling.add(job_id)
            run = self.backend.runs.get(job_id)
            if run is not None and run.proc is not None:
                await asyncio.to_thread(cancel_job, run.proc)
            task = self._owners.get(job_id)
            if task is not None:
                await asyncio.wait({task}, timeout=30.0)
        return self.get(job_id)

    def _end_stream(self, job_id: str, record: dict[str, Any]) -> None:
        events = self._events.get(job_id)
        if events is not None:  # its queued phase is in memory: end the stream as a run's ends
            events.extend([record])
            events.close()

    def events(self, job_id: str) -> JobEvents:
        """The job's events: live for a running job, read back from its progress file otherwise."""
        row = self.get(job_id)
        events = self._events.get(job_id)
        if events is None:
            events = self._events[job_id] = JobEvents()
            path = self.root / job_id / "progress.jsonl"
            if path.exists():
                events.extend(tail_lines(path.read_bytes())[0])
            if row.state in FINAL:
                events.extend([{"event": "state", "state": row.state, "time": row.finished_ts}])
                events.close()
        return events

    def summary(self, row: JobRow) -> dict[str, Any]:
        """The row, its progress, what the job page shows (phase, features, live, times) and where
        the scheduler has it (``schedule``)."""
        events = self._events.get(row.id)
        if events is None and (self.root / row.id / "progress.jsonl").exists():
            events = self.events(row.id)
        figures = events.summary if events else {}
        if row.state in WAITING:
            phase: str = row.state
        elif row.state == "running":
            phase = figures.get("phase") or "starting"
        else:
            phase = row.state
        end = row.finished_ts if row.finished_ts is not None else self.clock()
        return {
            **row.to_json(),
            "progress": figures or None,
            "events": len(events.events) if events else 0,
            "phase": phase,
            "features": figures.get("features"),
            "live": figures.get("live", {}),
            "elapsed_s": None if row.started_ts is None else round(end - row.started_ts, 1),
            "eta_s": (events.eta_s() if events else None) if row.state == "running" else None,
            "schedule": self._schedule_view(row),
        }

    def _schedule_view(self, row: JobRow) -> dict[str, Any]:
        """Queue position, the last decision about the job and why, and its live accounting."""
        state = self.backend.states.get(row.id)
        entry = self.backend.queue_entry(row.id) if state is not None else None
        run = self.backend.runs.get(row.id)
        return {
            "queue_position": entry.position if entry is not None and row.state in WAITING else None,
            "queue_state": entry.state if entry is not None else None,
            "reason": entry.reason if entry is not None else None,
            "decision": self.backend.decisions.get(row.id),
            "attained_service_s": round(state.attained_service if state else row.attained_service_s, 3),
            "steps_done": int(state.steps_done) if state else row.steps_done,
            "throughput": dict(state.throughput) if state else row.throughput,
            "preemptions": state.preemptions if state else row.preemptions,
            "nodes": list(run.nodes) if run is not None else [],
            "lease_revoked": run.revoked if run is not None else False,
        }

    # -- rounds and the owner task of each run -----------------------------------------------------
    async def _schedule(self) -> None:
        while True:
            try:
                self.backend.round()
            except Exception:  # a plan that must not run is a bug: log it, keep cloudd up
                log.exception("scheduling round")
            await wait_event(self._wake, self.settings.round_interval_s)
            self._wake.clear()
            for job_id in [j for j, t in self._owners.items() if t.done()]:
                self._owners.pop(job_id)

    def _launch_owner(self, job_id: str, run: Run) -> None:
        self._owners[job_id] = asyncio.create_task(self._own(job_id, run), name=f"job-{job_id}")

    def _refused_by_admission(self, job_id: str, reason: str) -> None:
        row = self.table.set_state(job_id, "failed", finished_ts=self.clock(), error=f"admission: {reason}")
        self._end_stream(job_id, {"event": "state", "state": "failed", "time": row.finished_ts})

    async def _own(self, job_id: str, run: Run) -> None:
        row = self.get(job_id)
        row = self.table.set_state(job_id, "running", started_ts=row.started_ts or self.clock(), error=None)
        spec = JobSpec.model_validate(row.spec)
        events = self.events(job_id)  # after a cloudd restart: the earlier runs' lines, read back
        if events.closed:
            events = self._events[job_id] = JobEvents()
        events.extend(
            [
                {"event": "state", "state": "running", "time": self.clock(), "nodes": list(run.nodes)},
                {"event": "phase", "phase": "starting", "time": self.clock()},
            ]
        )
        final: JobState
        try:
            final, fields = "succeeded", await self.runner.run(job_id, spec, run, events)
        except asyncio.CancelledError:
            # cloudd is stopping: the job goes back to the queue and resumes from its checkpoint
            if run.proc is not None:
                await asyncio.shield(asyncio.to_thread(cancel_job, run.proc))
            self._persist(job_id, "queued", error="interrupted by cloudd shutdown; resumes")
            raise
        except Preempted as exc:
            final, fields = "preempted", {"error": f"preempted at step {exc.step}; resumes"}
        except JobFailure as exc:
            final, fields = "failed", {"error": str(exc)}
        except Exception as exc:  # a bug or a disk error: the job fails, cloudd stays up
            log.exception("job %s", job_id)
            final, fields = "failed", {"error": f"internal: {exc}"}
        if job_id in self._cancelling and final != "succeeded":
            final, fields = "cancelled", {"error": "cancelled"}
        self._cancelling.discard(job_id)
        if final != "preempted":
            fields["finished_ts"] = self.clock()
        self._persist(job_id, final, **fields)
        said = {k: v for k, v in fields.items() if k in ("exit_code", "error")}
        events.extend([{"event": "state", "state": final, "time": self.clock(), **said}])
        if final != "preempted":
            events.close()
        self._wake.set()

    def _persist(self, job_id: str, final: JobState, **fields: Any) -> None:
        """The run's end in the table, with the scheduler's accounting of the job."""
        state = self.backend.ended(job_id, final)
        fields.update(
            attained_service_s=state.attained_service,
            steps_done=int(state.steps_done),
            throughput=state.throughput,
            preemptions=state.preemptions,
        )
        self.table.set_state(job_id, final, **fields)
