"""Real processes for tests: free ports, starting a module of this repo, waiting for its port, stopping.

Every daemon a test starts is a ``python -m <module>`` of this checkout, run from the repository root
with the root on PYTHONPATH (so ``tests.harness`` imports in helper scripts too), its stdout and
stderr appended to a log file (a pipe nobody reads would fill and stall the daemon). ``stop_process``
is SIGTERM, then SIGKILL after a timeout; a crash test uses ``proc.kill()`` itself.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.harness.poll import wait_until

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def repo_env(**extra: str) -> dict[str, str]:
    """The environment for a child process: this one's, with the repository root on PYTHONPATH."""
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), **extra}


def start_module(
    module: str, args: list[str], log_path: Path, *, under: Sequence[str] = (), **popen: Any
) -> subprocess.Popen:
    """``python -m module *args`` from the repository root (run by the command ``under``, when
    given), output appended to ``log_path``."""
    argv = [*under, sys.executable, "-m", module, *args]
    return start_program(argv, log_path, cwd=REPO, env=repo_env(), **popen)


def start_program(argv: list[str], log_path: Path, **popen: Any) -> subprocess.Popen:
    """``argv`` (a program installed elsewhere: give its ``cwd`` and ``env``), output appended to
    ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, **popen)


def run_module(module: str, args: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    """``python -m module *args`` to completion, output captured as text (a CLI under test)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=repo_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


class ProcessExited(RuntimeError):
    """The process a test waits on is gone (not a "not yet": waiting longer cannot help)."""


def wait_for_port(port: int, timeout_s: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    """Until something accepts connections on 127.0.0.1:``port``; fails at once if ``proc`` exits."""

    def listening() -> bool:
        if proc is not None and proc.poll() is not None:
            raise ProcessExited(f"process exited with {proc.returncode} before listening on {port}")
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True

    wait_until(listening, timeout_s, f"a listener on 127.0.0.1:{port}", ignoring=(OSError,))


def stop_process(proc: subprocess.Popen, timeout_s: float = 10.0) -> int:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def kill_process(proc: subprocess.Popen) -> None:
    """SIGKILL (no shutdown of any kind: the crash tests' fault) and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set size so far (VmHWM in /proc/<pid>/status), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise LookupError(f"no VmHWM in /proc/{pid}/status")


class LogFile:
    """A daemon's log file, read from where this run of the daemon started writing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start = path.stat().st_size if path.exists() else 0

    def text(self) -> str:
        if not self.path.exists():
            return ""
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read().decode(errors="replace")
