"""JobRunner: one run of a job, as a chain of processes in ``<data_dir>/jobs/<id>/``, each with a
deadline: build the dataset from gateways' uploads (sensor windows, camera frames:
``cloud.jobs.datasets`` writes the tensor file the job TOML names), prepare (``cloud.jobs.prepare``:
an uploaded dataset file becomes that tensor file, the model is checked, the job TOML written),
train (``torchrun ... -m cloud.training.run``, holding the preemption lease ``<workdir>/lease``),
export (``cloud.jobs.export``), gate (``cloud.rollout.gate``: the new version and the name's
production on the job's held-out rows); then the artifact is stored in the model registry as
version ``<id>``, a candidate, with the job's lineage and the gate's evaluation. Each process gets
the spec's ``pythonpath`` on PYTHONPATH (a model factory's folder). The torchrun step tails
``progress.jsonl`` into the job's ``JobEvents``, between the runner's own phase events
(``exporting``, ``evaluating``).

Invariants: a run ends ``succeeded`` only after its model version is in the registry with its
evaluation; it ends ``Preempted`` only when the trainer wrote its ``preempted`` line (after a
complete checkpoint); the lease is revoked only while torchrun runs (``backend.TorchrunBackend``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud.jobs.events import JobEvents, tail_lines
from cloud.jobs.spec import LEASE_FILE, UPLOADED_DATASETS, JobSpec
from cloud.jobs.torchrun import launch_job, python_path
from cloud.jobs.uploads import UploadedDatasets
from cloud.registry import ModelRegistry
from cloud.rollout.gate import gate_command
from cloud.rollout.verdict import GateConfig
from models.artifact import ONNX_FILE, ArtifactError, load_artifact

STEP_DEADLINE_S = 600.0  # dataset build and export, each
POLL_S = 0.25


class JobFailure(Exception):
    """A job step failed; the message says which and why."""


class Preempted(Exception):
    """The run stopped because its lease was revoked; ``step`` is the checkpointed step."""

    def __init__(self, step: int) -> None:
        super().__init__(f"preempted at step {step}")
        self.step = step


@dataclass
class Run:
    """One launch of a job: where it runs, since when, and how it is stopped."""

    nodes: tuple[str, ...]
    devices: int
    generation: str
    started: float  # clock time of the launch
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    revoked: bool = False
    steps: list[tuple[int, float]] = field(default_factory=list)  # (step, time) of its step lines
    total_steps: int | None = None  # the trainer's start line says

    def revoke(self) -> None:
        """Take the lease back: the trainer stops at its next step boundary, checkpointed."""
        self.revoked = True
        (self.workdir / LEASE_FILE).unlink(missing_ok=True)

    def steps_per_s(self) -> float | None:
        """This run's measured rate: steps between its first and last step lines over their time."""
        if len(self.steps) < 2:
            return None
        (s0, t0), (s1, t1) = self.steps[0], self.steps[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None


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


class JobRunner:
    def __init__(
        self,
        data_dir: Path,
        registry: ModelRegistry,
        uploads: UploadedDatasets,
        gate: GateConfig,
        clock: Callable[[], float],
    ) -> None:
        self.data_dir, self.registry, self.uploads = data_dir, registry, uploads
        self.gate, self.clock = gate, clock

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

    async def run(self, job_id: str, spec: JobSpec, run: Run, events: JobEvents) -> dict[str, Any]:
        """Prepare, train, export, gate, register; the job's final fields. Raises ``Preempted``
        (the lease was revoked) or ``JobFailure``."""
        workdir = run.workdir
        upload = await asyncio.to_thread(self.uploads.meta, spec.upload) if spec.upload else None
        if spec.upload and upload is None:
            raise JobFailure(f"dataset: the uploaded dataset {spec.upload!r} is gone")
        await asyncio.to_thread(_prepare_workdir, workdir, spec, upload)
        # a resumed job keeps the rows it started with
        from_gateways = spec.dataset_name in UPLOADED_DATASETS
        if from_gateways and not await asyncio.to_thread((workdir / "dataset.pt").exists):
            gateways = [arg for gw in spec.gateways for arg in ("--gateway", gw)]
            dataset = ["--kind", spec.dataset_name, "--data-dir", str(self.data_dir), "--out", str(workdir)]
            command = [
                sys.executable,
                "-m",
                "cloud.jobs.datasets",
                *dataset,
                "--min-rows",
                str(spec.min_rows),
            ]
            await self._step("dataset", [*command, *gateways], workdir, spec)
        upload_args = ["--upload", str(self.uploads.data_file(spec.upload))] if spec.upload else []
        init_args = await asyncio.to_thread(self._init_args, spec)
        prepare = [
            sys.executable,
            "-m",
            "cloud.jobs.prepare",
            "--workdir",
            str(workdir),
            *upload_args,
            *init_args,
        ]
        await self._step("prepare", prepare, workdir, spec)
        await self._train(spec, run, events)
        await asyncio.to_thread(_complete_lineage, workdir, job_id, spec)
        return await self._export_and_register(job_id, spec, workdir, events)

    async def _train(self, spec: JobSpec, run: Run, events: JobEvents) -> None:
        workdir = run.workdir
        await asyncio.to_thread((workdir / LEASE_FILE).touch)
        run.proc = await asyncio.to_thread(
            launch_job, workdir / "job.toml", spec.nproc, workdir, pythonpath=spec.pythonpath
        )
        code = await self._follow(run, workdir / "progress.jsonl", events)
        if code == 0:
            return
        last = events.events[-1] if events.events else {}
        if last.get("event") == "preempted":  # torchrun exits 1 when its workers exit EXIT_PREEMPTED
            raise Preempted(int(last["step"]))
        errors = [e for e in events.events if e.get("event") == "error"]
        why = errors[-1].get("message") if errors else "see torchrun.log"
        raise JobFailure(f"torchrun exited {code}: {why}")

    async def _export_and_register(
        self, job_id: str, spec: JobSpec, workdir: Path, events: JobEvents
    ) -> dict[str, Any]:
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
        events.extend([{"event": "registered", "time": self.clock(), "model": entry}])
        return {"exit_code": 0, "model": entry, "lineage": artifact.metadata.notes.get("lineage")}

    async def _follow(self, run: Run, path: Path, events: JobEvents) -> int:
        """Tail the progress file into ``events`` until torchrun exits; returns its exit code."""
        proc, pending = run.proc, b""
        if proc is None:
            raise RuntimeError("_follow before launch")
        # a resumed run appends to the file: its earlier runs' lines are in ``events`` already
        offset = await asyncio.to_thread(lambda: path.stat().st_size if path.exists() else 0)
        while True:
            code = proc.poll()
            chunk = await asyncio.to_thread(_read_from, path, offset)
            offset += len(chunk)
            records, used = tail_lines(pending + chunk)
            pending = (pending + chunk)[used:]
            events.extend(records)
            for record in records:
                if record.get("event") == "step":
                    run.steps.append((int(record["step"]), float(record["time"])))
                elif record.get("event") == "start":
                    run.total_steps = int(record["total_steps"])
            if code is not None:
                return code
            await asyncio.sleep(POLL_S)
