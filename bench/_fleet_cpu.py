"""The serving side's CPU during a fleet run: cloudd replicas, haproxy and PostgreSQL, sampled on a
thread of its own, so that a stage's figures can say how much CPU each stored batch cost; beside
it the load driver's (this process's other children: its worker processes) and the whole machine's
busy CPU (the serving side, the driver and whatever else runs on the machine).

Why: on the shared 2-core machine the other work running changes how many batches a deployment
stores per second far more than any change to cloudd does; CPU per stored batch (the serving side's
CPU seconds in a window over the batches it stored in it) barely depends on that, and it is what
congestion collapse is: past capacity, CPU spent on uploads that are refused or given up on, so
that each stored batch costs more.

Invariant: ``cpu_s(lo, hi)`` is the CPU (user + system) the sampled processes and their children
(``driver_s``: this process's other children; ``machine_s``: every process on the machine, from
``/proc/stat``, idle and iowait left out) used
between two samples bracketing ``[lo, hi]`` as closely as ``SAMPLE_S`` allows; a process that
ended between samples takes its last sample's CPU with it (PostgreSQL's pooled backends live as
long as their replica, so little is lost).
"""

from __future__ import annotations

import bisect
import threading
import time
from pathlib import Path

import psutil

SAMPLE_S = 0.5


def postmaster_pid(data_dir: Path) -> int:
    """The PostgreSQL server's pid, from the first line of its ``postmaster.pid``."""
    return int((data_dir / "postmaster.pid").read_text().splitlines()[0])


def _tree_cpu_s(roots: list[psutil.Process]) -> float:
    total = 0.0
    for root in roots:
        try:
            family = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for process in family:
            try:
                times = process.cpu_times()
            except psutil.Error:  # ended since it was listed
                continue
            total += times.user + times.system
    return total


class ServingCpu:
    """Samples the CPU of ``pids`` and their children every ``SAMPLE_S`` until its owner leaves
    the ``with`` block."""

    def __init__(self, pids: list[int]) -> None:
        self._roots = [psutil.Process(pid) for pid in pids]
        self._me = psutil.Process()
        self._times: list[float] = []  # wall clock of each sample
        self._cpu: list[float] = []  # the processes' CPU seconds then
        self._machine: list[float] = []  # the machine's busy CPU seconds then
        self._driver: list[float] = []  # the driver's CPU seconds then
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serving-cpu")

    def __enter__(self) -> ServingCpu:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def _sample(self) -> None:
        cpu = _tree_cpu_s(self._roots)
        serving = {root.pid for root in self._roots}
        try:
            others = [child for child in self._me.children() if child.pid not in serving]
        except psutil.Error:
            others = []
        driver = _tree_cpu_s(others)
        machine = psutil.cpu_times()
        self._driver.append(driver)
        self._times.append(time.time())
        self._cpu.append(cpu)
        self._machine.append(sum(machine) - machine.idle - getattr(machine, "iowait", 0.0))

    def cpu_s(self, lo: float, hi: float) -> float:
        """The serving side's CPU seconds between the samples nearest ``lo`` and ``hi`` (nan if
        none between)."""
        return self._between(self._cpu, lo, hi)

    def driver_s(self, lo: float, hi: float) -> float:
        """The driver's CPU seconds, likewise (a worker that ended takes its CPU out of later
        samples: only windows inside the run are meant)."""
        return self._between(self._driver, lo, hi)

    def machine_s(self, lo: float, hi: float) -> float:
        """The machine's busy CPU seconds, likewise."""
        return self._between(self._machine, lo, hi)

    def _between(self, series: list[float], lo: float, hi: float) -> float:
        first = min(bisect.bisect_left(self._times, lo), len(self._times) - 1)
        last = max(bisect.bisect_right(self._times, hi) - 1, 0)
        if last <= first:
            return float("nan")
        return series[last] - series[first]
