"""deploy/install-gateway.sh on this machine, as root: it installs (a user, the directories, a venv
with edgefed, the config and the unit), the unit's own ExecStart runs as the unit's user (systemd
is not PID 1 here) and stops cleanly on SIGTERM, a second install changes nothing it should keep,
and uninstall --purge removes it all. Paths and user are the script's options, so the test installs
beside, not over, a real installation."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest

from tests.harness.gatewayd import telemetry
from tests.harness.mqtt import publish
from tests.harness.poll import wait_until
from tests.harness.processes import REPO, free_port
from tests.harness.seccomp import unit_settings

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),  # a venv and pip install of the project
    pytest.mark.skipif(os.geteuid() != 0, reason="the installer creates a user: root only"),
]
SCRIPT = REPO / "deploy" / "install-gateway.sh"
USER = "edgefed-test"


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def installer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=540)


def test_install_start_as_the_units_user_and_uninstall(mosquitto):
    root = Path(tempfile.mkdtemp(prefix="edgefed-install-", dir="/var/tmp"))
    root.chmod(0o755)  # the unit's user must reach the venv under it
    paths = {
        "--prefix": root / "opt",
        "--config-dir": root / "etc",
        "--state-dir": root / "state",
        "--unit-dir": root / "units",
    }
    options = [str(part) for option, path in paths.items() for part in (option, path)] + ["--user", USER]
    try:
        done = installer("install", *options)
        assert done.returncode == 0, done.stdout + done.stderr
        unit = root / "units" / "gatewayd.service"
        account = pwd.getpwnam(USER)
        assert unit_settings(unit, "User") == [USER]
        assert (root / "state").stat().st_uid == account.pw_uid
        config = root / "etc" / "gateway.toml"
        assert f'data_dir = "{root / "state"}"' in config.read_text()

        # the operator's edits: this broker, an HTTP port; a second install must keep them
        http_port = free_port()
        text = config.read_text().replace("mqtt://127.0.0.1:1883", mosquitto.url)
        config.write_text(text.replace("127.0.0.1:9100", f"127.0.0.1:{http_port}"))
        again = installer("install", *options)
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"127.0.0.1:{http_port}" in config.read_text()

        command = shlex.split(unit_settings(unit, "ExecStart")[0])
        assert command[0] == str(root / "opt" / "venv" / "bin" / "gatewayd")
        daemon = subprocess.Popen(
            # setpriv execs the command as the user (runuser would stay between it and our SIGTERM)
            ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups", "--", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            status_url = f"http://127.0.0.1:{http_port}/status"
            wait_until(
                lambda: get_json(status_url)["mqtt"]["connected"] == 1, 60, "the installed gatewayd up"
            )
            publish(mosquitto.port, [("edgefed/gw1/devices/sensor-1/telemetry", telemetry("sensor-1", 1))])
            wait_until(lambda: get_json(status_url)["log"]["durable_lsn"] >= 1, 20, "telemetry logged")
            assert all(p.stat().st_uid == account.pw_uid for p in (root / "state").rglob("*"))
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(30) == 0, daemon.stdout.read().decode() if daemon.stdout else ""
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()

        gone = installer("uninstall", "--purge", *options)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert not any(path.exists() for path in paths.values() if path.name != "units")
        assert not unit.exists()
        with pytest.raises(KeyError):
            pwd.getpwnam(USER)
    finally:
        installer("uninstall", "--purge", *options)
        shutil.rmtree(root, ignore_errors=True)
