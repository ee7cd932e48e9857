"""deploy/systemd/gatewayd.service as systemd would run it, without systemd as PID 1.

``systemd-analyze verify`` and ``security --offline`` check the unit file; gatewayd with the camera
and federated training on runs under the unit's own system call filter (tests/harness/seccomp.py
builds it from the unit's lines with systemd's tables): it starts, infers frames, trains a round,
keeps its anonymous memory under the unit's ``MemoryHigh=`` and its peak RSS under ``MemoryMax=``,
and exits 0 on SIGTERM. Before the unit allowed
``sched_setaffinity`` and ``mbind`` (in ``@resources``), the first onnxruntime import killed it."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.federated.test_gatewayd_training import put_tiny_digits_job, write_samples
from tests.harness.camera import DevicesimCamera
from tests.harness.cloudd import cloudd_token, start_cloudd
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.processes import REPO, free_port, peak_rss_kib
from tests.harness.seccomp import unit_filter, unit_settings

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
UNIT = REPO / "deploy" / "systemd" / "gatewayd.service"
SECURITY_THRESHOLD = 20  # systemd-analyze's exposure x 10: "OK" is below 40; the unit scores 17
UNDER_THE_FILTER = [sys.executable, "-m", "tests.harness.seccomp", "--unit", str(UNIT), "--"]


def unit_here(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this environment's gatewayd (verify checks it exists)."""
    installed = str(Path(sys.executable).parent / "gatewayd")
    text = UNIT.read_text().replace("/opt/edgefed/venv/bin/gatewayd", installed)
    assert text != UNIT.read_text(), "ExecStart is no longer the installer's venv"
    (tmp_path / "gatewayd.service").write_text(text)
    return tmp_path / "gatewayd.service"


def unit_memory_bytes(key: str) -> int:
    """The unit's ``MemoryHigh=`` (above it the kernel reclaims and throttles) or ``MemoryMax=``."""
    value = unit_settings(UNIT, key)[-1]
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(value[:-1]) * units[value[-1]] if value[-1] in units else int(value)


class AnonPeak:
    """The largest anonymous resident memory (RssAnon: what reclaim cannot take back) of ``pid``,
    sampled every 0.1 s. The total (VmHWM) also counts the libraries' file pages, which the kernel
    reclaims under MemoryHigh and which vary with the page cache (144-262 MiB here for the same run)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.bytes = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("RssAnon:"):
                        self.bytes = max(self.bytes, int(line.split()[1]) * 1024)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.bytes


def test_the_unit_verifies_and_its_exposure_is_low(tmp_path):
    unit = unit_here(tmp_path)
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", f"--threshold={SECURITY_THRESHOLD}", str(unit)],
        capture_output=True,
        text=True,
    )
    assert security.returncode == 0, security.stdout[-2000:]


def test_the_filter_allows_what_the_libraries_need_and_refuses_privileged_calls():
    rules = unit_filter(UNIT)
    assert rules is not None and rules.allow_list
    assert all(rules.allows(name) for name in ("sched_setaffinity", "mbind", "set_mempolicy", "read"))
    assert not any(rules.allows(name) for name in ("setuid", "mount", "reboot", "setrlimit"))
    probe = "import os, onnxruntime; os.sched_setaffinity(0, os.sched_getaffinity(0)); os.setuid(0)"
    done = subprocess.run([*UNDER_THE_FILTER, sys.executable, "-c", probe], capture_output=True, text=True)
    # the library calls pass; setuid is refused with EPERM (SystemCallErrorNumber), not SIGSYS
    assert done.returncode == 1 and "PermissionError: [Errno 1]" in done.stderr, done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_gatewayd_with_camera_and_training_runs_under_the_units_filter(mosquitto, tmp_path):
    cloudd = start_cloudd(tmp_path / "cloud", gateways=("gw1",))
    camera = DevicesimCamera(free_port(), tmp_path / "truth.jsonl", fps=4.0)
    gateway = None
    try:
        put_tiny_digits_job(cloudd)
        extra = (
            f'blob_dir = "blobs"\n[camera]\nenabled = true\nsource = "{camera.url}"\n'
            "[training]\nenabled = true\nprivate = true\npoll_interval_s = 0.3\nretrain_after_s = 2.0\n"
        )
        config, http_port = write_config(
            tmp_path, mosquitto.url, cloud_url=cloudd.url, token=cloudd_token("gw1"), extra=extra
        )
        asyncio.run(write_samples(tmp_path / "data-gw1"))
        gateway = Gatewayd(config, http_port, under=UNDER_THE_FILTER).wait_ready(60)
        anon = AnonPeak(gateway.proc.pid)
        gateway.wait_status(lambda s: s["camera"]["engine"]["inferred"] >= 3, 60, "frames inferred")
        gateway.wait_status(lambda s: s["training"]["client"]["updates_sent"] >= 1, 120, "a round trained")
        anon_peak, peak = anon.stop(), peak_rss_kib(gateway.proc.pid) * 1024
        assert anon_peak < unit_memory_bytes("MemoryHigh"), f"anonymous memory {anon_peak >> 20} MiB"
        assert peak < unit_memory_bytes("MemoryMax"), f"peak RSS {peak >> 20} MiB"
        code, output = gateway.terminate(30)
        assert code == 0, output[-3000:]
        assert "Bad system call" not in output
    finally:
        if gateway is not None:
            gateway.kill()
        camera.stop()
        cloudd.stop()
