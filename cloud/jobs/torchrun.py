"""What ``cloudd`` calls to run training jobs: launch under torchrun, read progress, cancel.

A job is one ``torchrun --standalone --nproc-per-node N -m cloud.training.run --job job.toml``
on this machine, in its own session. torchrun starts each worker in a session of its own, so
SIGKILL of torchrun's group alone would orphan the workers: ``kill_job`` kills every group.

Invariant: ``read_progress`` returns only whole JSON lines; a line still being written (no
newline yet, or not JSON) is left for the next read, never returned half.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parents[2]


def torchrun_command(job_toml_path: str | Path, nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "cloud.training.run",
        "--job",
        str(Path(job_toml_path).resolve()),
    ]


def python_path(extra: str | None = None) -> str:
    """PYTHONPATH for a job's processes: this repository, a job's own folder (a model factory's),
    then whatever cloudd was started with."""
    return os.pathsep.join(filter(None, [str(_REPO_ROOT), extra, os.environ.get("PYTHONPATH")]))


def launch_job(
    job_toml_path: str | Path,
    nproc: int,
    workdir: str | Path,
    *,
    threads_per_proc: int = 1,
    pythonpath: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start the job; its output goes to ``<workdir>/torchrun.log``. Returns the torchrun process
    (leader of its own process group; see ``cancel_job``). ``pythonpath``: a folder the workers
    import the model factory from."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads_per_proc), PYTHONPATH=python_path(pythonpath))
    log = open(workdir / "torchrun.log", "ab")  # noqa: SIM115 - handed to the child, closed below
    try:
        return subprocess.Popen(
            torchrun_command(job_toml_path, nproc),
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()  # the child holds its own copy of the descriptor


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc); torchrun starts each worker in its own session."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            children.append(int(entry.name))
    return children


def kill_job(proc: subprocess.Popen[bytes]) -> int:
    """SIGKILL torchrun's process group and each worker's (a crash, as far as the job can tell)."""
    groups = [proc.pid] + _children(proc.pid)  # listed before the kill: orphans are harder to find
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return proc.wait(30)


def cancel_job(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> int:
    """SIGTERM torchrun (it stops its workers); ``kill_job`` if that takes over ``timeout_s``."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return kill_job(proc)
        except ProcessLookupError:
            pass
    return proc.wait(timeout_s)


def read_progress(path: str | Path) -> list[dict[str, Any]]:
    """All whole JSON lines of a progress file (empty if the file does not exist yet)."""
    try:
        data = Path(path).read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in data.splitlines(keepends=True):
        if not line.endswith("\n"):
            break  # being written
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a crash mid-write; later lines are whole
    return records
