"""kill -9 of a real writer process at random moments; after each kill the log must be a prefix of
whole epochs holding every epoch the writer was told was durable (see docs/storage.md).

EDGEFED_KILL_TRIALS sets the number of trials (default 200, the issue's minimum).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gateway.storage.epoch_log import EpochLog
from gateway.storage.filelayer import OsFileLayer
from gateway.storage.recovery import recover_all
from tests.harness.poll import wait_until
from tests.harness.processes import REPO, repo_env
from tests.storage.storagetest_workload import check_prefix

pytestmark = pytest.mark.slow  # a crash sweep: 200 writers killed with SIGKILL

WRITER = [sys.executable, "-m", "tests.storage.crash_writer"]
TRIALS = int(os.environ.get("EDGEFED_KILL_TRIALS", "200"))
PARALLEL = 4
SPAWNED = 3  # per worker: trials with a fresh interpreter; the rest are forked by a zygote


def _check(directory: Path, out: str) -> str | None:
    notified = max((int(line[2:]) for line in out.splitlines() if line.startswith("D ")), default=0)
    recovered = recover_all(OsFileLayer(), str(directory))
    if recovered.damage is not None and recovered.damage.kind != "torn":
        return f"recovery found {recovered.damage}"
    if recovered.last_lsn < notified:
        return f"notified durable up to {notified}, recovered only {recovered.last_lsn}"
    return check_prefix(recovered.records)


def _spawned_trial(directory: Path, seed: int) -> str | None:
    """A fresh interpreter writing to stdout, killed with SIGKILL at a random moment."""
    rng = random.Random(seed)
    proc = subprocess.Popen(
        [*WRITER, str(directory), str(seed)],
        cwd=REPO,
        env=repo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = proc.stdout.readline()  # type: ignore[union-attr]
        if not ready.startswith("READY"):
            return f"writer did not start: {ready!r}"
        time.sleep(rng.uniform(0.0, 0.25))  # the scenario: a kill at a random moment of the writing
        os.kill(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != -signal.SIGKILL:
        return f"writer exited by itself ({proc.returncode}): {err[-2000:]}"
    return _check(directory, ready + out)


class _Zygote:
    """Forks writers on request (see crash_writer.py), so a trial costs a fork, not an interpreter."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [*WRITER, "--zygote"],
            cwd=REPO,
            env=repo_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self.proc.stdout.readline().strip()  # type: ignore[union-attr]

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _forked_trial(zygote: _Zygote, directory: Path, seed: int, out_file: Path) -> str | None:
    rng = random.Random(seed)
    pid = int(zygote.ask(f"RUN {directory} {seed} {out_file}").split()[1])
    if rng.random() < 0.1:  # sometimes kill it while it is still recovering
        time.sleep(rng.uniform(0.0, 0.05))  # the scenario: a random moment of the recovery
    else:
        try:
            wait_until(
                lambda: out_file.read_text().startswith("READY"), 30, "the writer's READY", interval_s=0.005
            )
        except TimeoutError:
            zygote.ask(f"KILL {pid}")
            return "writer did not start within 30 s"
        time.sleep(rng.uniform(0.0, 0.1))  # the scenario: a kill at a random moment of the writing
    if zygote.ask(f"KILL {pid}") != f"DEAD {pid}":
        return "zygote did not confirm the kill"
    return _check(directory, out_file.read_text() if out_file.exists() else "")


def _worker(directory: Path, seeds: list[int], spawned: int) -> list[str]:
    problems = []
    zygote = _Zygote()
    try:
        for n, seed in enumerate(seeds):
            if n < spawned:
                problem = _spawned_trial(directory, seed)
            else:
                problem = _forked_trial(zygote, directory, seed, directory.parent / f"{directory.name}.out")
            if problem:
                problems.append(f"seed {seed}: {problem}")
    finally:
        zygote.close()
    return problems


async def _final_read(directory: Path) -> str | None:
    log = EpochLog(directory, segment_bytes=256 * 1024, max_bytes=64 << 20)
    await log.open()
    try:
        records = [r async for r in log.read(0)]
        if records and records[0][0] != log.trimmed_lsn + 1:
            return f"read starts at {records[0][0]}, trimmed {log.trimmed_lsn}"
        if (records[-1][0] if records else log.trimmed_lsn) != log.durable_lsn:
            return "read did not reach durable_lsn"
        return check_prefix(records)
    finally:
        await log.close()


def test_kill9_random_moments_leave_a_prefix_of_epochs(tmp_path: Path) -> None:
    seeds = list(range(1, TRIALS + 1))
    groups = [seeds[i::PARALLEL] for i in range(PARALLEL)]
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(
            pool.map(_worker, [tmp_path / f"log{i}" for i in range(PARALLEL)], groups, [SPAWNED] * PARALLEL)
        )
    problems = [p for result in results for p in result]
    assert not problems, "\n".join(problems[:10])
    for i in range(PARALLEL):
        assert asyncio.run(_final_read(tmp_path / f"log{i}")) is None
