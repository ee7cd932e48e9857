"""JobManager: cloudd's training jobs: a bounded queue, at most ``max_running`` torchrun jobs at a
time, one owner task per running job, state persisted in ``JobTable``.

A job runs in ``<data_dir>/jobs/<id>/`` as a chain of processes, each with a deadline: build the
dataset from gateways' uploads (sensor windows, camera frames: ``cloud.jobs.datasets`` writes the
tensor file the job TOML names), prepare (``cloud.jobs.prepare``: an uploaded dataset file becomes
that tensor file, the model is checked, the job TOML written), train (``torchrun ... -m
cloud.training.run``), export (``cloud.jobs.export``), gate (``cloud.rollout.gate``: the new
version and the name's production on the job's held-out rows); then the artifact is stored in the
model registry as version ``<id>``, a candidate, with the job's lineage and the gate's evaluation.
Each process gets the spec's ``pythonpath`` on PYTHONPATH (a model factory's folder). The owner
task tails ``progress.jsonl`` into the job's ``JobEvents``, between the manager's own phase events
(``queued``, ``starting``, ``exporting``, ``evaluating``).

Invariants: a job is ``succeeded`` only after its model version is in the registry with its
evaluation (promotable or not: the gate decides where it may run, not whether it is kept); submissions
beyond ``max_queued`` waiting jobs are refused (``QueueFull``, counted in ``refused``), never
silently dropped; ``stop()`` leaves no torchrun behind (running jobs are stopped and go back to
``queued``, so the next cloudd resumes them from their last complete checkpoint).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cloud.jobs.events import JobEvents, tail_lines
from cloud.jobs.spec import UPLOADED_DATASETS, JobSpec
from cloud.jobs.table import FINAL, JobRow, JobState, JobTable
from cloud.jobs.torchrun import cancel_job, launch_job, python_path
from cloud.jobs.uploads import UploadedDatasets
from cloud.registry import ModelRegistry
from cloud.rollout.gate import gate_command
from cloud.rollout.verdict import GateConfig
from models.artifact import ONNX_FILE, ArtifactError, load_artifact
from runtime.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

STEP_DEADLINE_S = 600.0  # dataset build and export, each
POLL_S = 0.25


class QueueFull(Exception):
    """More jobs are waiting than ``max_queued``."""


class JobNotFound(KeyError):
    pass


class JobFailure(Exception):
    """A job step failed; the message says which and why."""


def _env(spec: JobSpec) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=python_path(spec.pythonpath))


def _prepare_workdir(workdir: Path, spec: JobSpec, upload: dict[str, Any] | None) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "spec.json").write_text(spec.model_dump_json())
    lineage: dict[str, Any] | None = None
    if spec.dataset_name == "digits":
        lineage = {"dataset": "digits", "source": "sklearn.datasets.load_digits", "split_seed": spec.seed}
    elif upload is not None:
        lineage = {"dataset": spec.dataset_name, "split_seed": spec.seed}
        lineage.update({k: upload[k] for k in ("sha256", "format", "rows", "uploaded_ts")})
    if lineage is not None:
        (workdir / "lineage.json").write_text(json.dumps(lineage))


def _complete_lineage(workdir: Path, job_id: str, spec: JobSpec) -> None:
    """Name the job (and what it was asked) in the lineage that the export puts into the artifact."""
    path = workdir / "lineage.json"
    lineage = json.loads(path.read_text())
    lineage.update(job=job_id, model=spec.model, schedule=spec.schedule, epochs=spec.epochs, nproc=spec.nproc)
    path.write_text(json.dumps(lineage))


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read()
    except FileNotFoundError:
        return b""


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
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.data_dir, self.root = data_dir, data_dir / "jobs"
        self.gate = gate or GateConfig()
        self.registry, self.clock = registry, clock
        self.uploads = uploads or UploadedDatasets(data_dir / "uploads", max_bytes=0)
        self.max_running, self.max_queued = max_running, max_queued
        self.refused = 0
        self._table: JobTable | None = None
        self._events: dict[str, JobEvents] = {}
        self._owners: dict[str, asyncio.Task[None]] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._cancelling: set[str] = set()
        self._wake = asyncio.Event()
        self._scheduler: asyncio.Task[None] | None = None
        self._stopping = False

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._table is not None:
            raise RuntimeError("JobManager already started")
        self._table = JobTable(self.root / "jobs.sqlite")
        for row in self._table.all("running"):  # cloudd stopped (or crashed) under it: resume it
            self._table.set_state(row.id, "queued", error="interrupted by a cloudd restart; resumes")
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
        self._wake.set()
        return row

    def get(self, job_id: str) -> JobRow:
        row = self.table.get(job_id)
        if row is None:
            raise JobNotFound(job_id)
        return row

    # Below this method, ``list`` in this class body names it, not the builtin: annotate with Sequence.
    def list(self) -> list[JobRow]:
        return self.table.all()

    def counts(self) -> dict[str, int]:
        rows = self.table.all()
        return {
            "running": sum(r.state == "running" for r in rows),
            "queued": sum(r.state == "queued" for r in rows),
            "total": len(rows),
            "refused": self.refused,
        }

    async def cancel(self, job_id: str) -> JobRow:
        row = self.get(job_id)
        if row.state == "queued":
            row = self.table.set_state(job_id, "cancelled", finished_ts=self.clock(), error="cancelled")
            events = self._events.get(job_id)
            if events is not None:  # its queued phase is in memory: end the stream as a run's ends
                events.extend([{"event": "state", "state": "cancelled", "time": row.finished_ts}])
                events.close()
            return row
        if row.state == "running":
            self._cancelling.add(job_id)
            proc = self._procs.get(job_id)
            if proc is not None:
                await asyncio.to_thread(cancel_job, proc)
            task = self._owners.get(job_id)
            if task is not None:
                await asyncio.wait({task}, timeout=30.0)
        return self.get(job_id)

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
        """The row, its progress, and what the job page shows: phase, features, live, times."""
        events = self._events.get(row.id)
        if events is None and (self.root / row.id / "progress.jsonl").exists():
            events = self.events(row.id)
        figures = events.summary if events else {}
        if row.state == "queued":
            phase = "queued"
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
        }

    # -- scheduling and the owner task of each job -------------------------------------------------
    async def _schedule(self) -> None:
        while True:
            running = sum(not t.done() for t in self._owners.values())
            for row in self.table.all("queued")[: max(0, self.max_running - running)]:
                self._owners[row.id] = asyncio.create_task(self._own(row.id), name=f"job-{row.id}")
            await wait_event(self._wake, 1.0)
            self._wake.clear()
            for job_id in [j for j, t in self._owners.items() if t.done()]:
                self._owners.pop(job_id)

    async def _own(self, job_id: str) -> None:
        row = self.table.set_state(job_id, "running", started_ts=self.clock())
        spec = JobSpec.model_validate(row.spec)
        workdir = self.root / job_id
        events = self._events.get(job_id)
        if events is None or events.closed:
            events = self._events[job_id] = JobEvents()
        events.extend(
            [
                {"event": "state", "state": "running", "time": self.clock()},
                {"event": "phase", "phase": "starting", "time": self.clock()},
            ]
        )
        try:
            final, fields = await self._run(job_id, spec, workdir, events)
        except asyncio.CancelledError:
            # cloudd is stopping: the job goes back to the queue and resumes from its checkpoint
            proc = self._procs.pop(job_id, None)
            if proc is not None:
                await asyncio.shield(asyncio.to_thread(cancel_job, proc))
            self.table.set_state(job_id, "queued", error="interrupted by cloudd shutdown; resumes")
            raise
        except JobFailure as exc:
            final, fields = "failed", {"error": str(exc)}
        except Exception as exc:  # a bug or a disk error: the job fails, cloudd stays up
            log.exception("job %s", job_id)
            final, fields = "failed", {"error": f"internal: {exc}"}
        finally:
            self._procs.pop(job_id, None)
        if job_id in self._cancelling and final != "succeeded":
            final, fields = "cancelled", {"error": "cancelled"}
        self._cancelling.discard(job_id)
        self.table.set_state(job_id, final, finished_ts=self.clock(), **fields)
        events.extend([{"event": "state", "state": final, "time": self.clock(), **fields}])
        events.close()
        self._wake.set()

    async def _step(self, name: str, command: Sequence[str], workdir: Path, spec: JobSpec) -> None:
        out = await asyncio.to_thread(open, workdir / f"{name}.log", "ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, cwd=workdir, env=_env(spec), stdout=out, stderr=subprocess.STDOUT
            )
        finally:
            out.close()  # the child has its own descriptor
        try:
            async with asyncio.timeout(STEP_DEADLINE_S):
                code = await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise JobFailure(f"{name}: no result within {STEP_DEADLINE_S:.0f}s") from None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        if code != 0:
            tail = (workdir / f"{name}.log").read_text(errors="replace").strip().splitlines()[-1:]
            raise JobFailure(f"{name} exited {code}: {' '.join(tail)}")

    def _init_args(self, spec: JobSpec) -> tuple[str, ...]:
        """prepare's ``--init-onnx``: the version ``init_from`` names (``production``: the alias, else
        the factory version), as stored under the job's registry name."""
        if spec.init_from is None:
            return ()
        name, version = spec.model_name, spec.init_from
        if version == "production":
            version = self.registry.lifecycle(name).production or self.registry.factory_version(name) or ""
        if not version or self.registry.entry(name, version) is None:
            raise JobFailure(f"init_from: the registry has no {name}@{spec.init_from}")
        return ("--init-onnx", str(self.registry.folder(name, version) / ONNX_FILE))

    async def _run(
        self, job_id: str, spec: JobSpec, workdir: Path, events: JobEvents
    ) -> tuple[JobState, dict[str, Any]]:
        upload = await asyncio.to_thread(self.uploads.meta, spec.upload) if spec.upload else None
        if spec.upload and upload is None:
            raise JobFailure(f"dataset: the uploaded dataset {spec.upload!r} is gone")
        await asyncio.to_thread(_prepare_workdir, workdir, spec, upload)
        # a resumed job keeps the rows it started with
        from_gateways = spec.dataset_name in UPLOADED_DATASETS
        if from_gateways and not await asyncio.to_thread((workdir / "dataset.pt").exists):
            gateways = [arg for gw in spec.gateways for arg in ("--gateway", gw)]
            await self._step(
                "dataset",
                [
                    sys.executable,
                    "-m",
                    "cloud.jobs.datasets",
                    "--kind",
                    spec.dataset_name,
                    "--data-dir",
                    str(self.data_dir),
                    "--out",
                    str(workdir),
                    "--min-rows",
                    str(spec.min_rows),
                    *gateways,
                ],
                workdir,
                spec,
            )
        upload_args = ["--upload", str(self.uploads.data_file(spec.upload))] if spec.upload else []
        init_args = await asyncio.to_thread(self._init_args, spec)
        await self._step(
            "prepare",
            [sys.executable, "-m", "cloud.jobs.prepare", "--workdir", str(workdir), *upload_args, *init_args],
            workdir,
            spec,
        )
        proc = await asyncio.to_thread(
            launch_job, workdir / "job.toml", spec.nproc, workdir, pythonpath=spec.pythonpath
        )
        self._procs[job_id] = proc
        code = await self._follow(proc, workdir / "progress.jsonl", events)
        if code != 0:
            errors = [e for e in events.events if e.get("event") == "error"]
            why = errors[-1].get("message") if errors else "see torchrun.log"
            raise JobFailure(f"torchrun exited {code}: {why}")
        await asyncio.to_thread(_complete_lineage, workdir, job_id, spec)
        events.extend([{"event": "phase", "phase": "exporting", "time": self.clock()}])
        out = workdir / "artifact"
        export = [
            "-m",
            "cloud.jobs.export",
            "--workdir",
            str(workdir),
            "--version",
            job_id,
            "--out",
            str(out),
        ]
        await self._step("export", [sys.executable, *export], workdir, spec)
        try:
            artifact = await asyncio.to_thread(load_artifact, out)
        except ArtifactError as exc:
            raise JobFailure(f"export: {exc}") from None
        # the quality gate: the new version and production, on the rows the job held out
        events.extend([{"event": "phase", "phase": "evaluating", "time": self.clock()}])
        production = self.registry.lifecycle(artifact.name).production
        baseline = self.registry.folder(artifact.name, production) if production else None
        verdict = workdir / "evaluation.json"
        await self._step("gate", gate_command(workdir, out, baseline, self.gate, verdict), workdir, spec)
        evaluation = json.loads(await asyncio.to_thread(verdict.read_text))
        events.extend([{"event": "evaluated", "time": self.clock(), "evaluation": evaluation}])
        status, entry = await self.registry.store(artifact, evaluation=evaluation)
        if status == 409:
            raise JobFailure(f"registry: {artifact.name}@{artifact.version} exists with other bytes")
        self.table.set_fields(job_id, model=entry, lineage=artifact.metadata.notes.get("lineage"))
        events.extend([{"event": "registered", "time": self.clock(), "model": entry}])
        return "succeeded", {"exit_code": 0}

    async def _follow(self, proc: subprocess.Popen[bytes], path: Path, events: JobEvents) -> int:
        """Tail the progress file into ``events`` until torchrun exits; returns its exit code."""
        offset, pending = 0, b""
        while True:
            code = proc.poll()
            chunk = await asyncio.to_thread(_read_from, path, offset)
            offset += len(chunk)
            records, used = tail_lines(pending + chunk)
            pending = (pending + chunk)[used:]
            events.extend(records)
            if code is not None:
                return code
            await asyncio.sleep(POLL_S)
