"""The Mosquitto broker of one test: a plain one (``start_broker``) and the secure one built from
deploy/mosquitto/ (``start_secure_broker``: TLS, passwords, the generated ACL, a throwaway CA).

Each broker has its own port and its own persistence directory, so sessions and retained messages
survive ``restart`` as they do in the field.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.processes import REPO, ProcessExited, free_port, stop_process, wait_for_port

DEPLOY = REPO / "deploy" / "mosquitto"
# the secure broker's accounts (deploy/mosquitto/make_passwd.sh makes its passwd file from these);
# sim-1 is devicesim's first sensor of gw1 (device sensor-000)
USERS = {
    "operator": "op-secret",
    "gw1": "gw1-secret",
    "sensor-1": "dev-secret",
    "gw2": "gw2-secret",
    "sim-1": "sim-secret",
}


def need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is not installed; the broker tests need it (apt-get install mosquitto openssl)")


@dataclass
class Broker:
    host: str
    port: int
    proc: subprocess.Popen
    config: Path

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    def log(self) -> str:
        """What this broker has logged (mosquitto.log beside its config), every run of it."""
        return (self.config.parent / "mosquitto.log").read_text(errors="replace")

    def restart(self) -> None:
        stop_process(self.proc)
        self.proc = start_mosquitto(self.config, self.port)

    def stop(self) -> None:
        stop_process(self.proc)


def start_mosquitto(config: Path, port: int) -> subprocess.Popen:
    """mosquitto with ``config``, its output appended to mosquitto.log beside the config; one that
    exits at start raises ProcessExited with the end of that log (why: "Unable to open pwfile")."""
    log_path = config.parent / "mosquitto.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(["mosquitto", "-c", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, proc=proc)
    except ProcessExited as exc:
        raise ProcessExited(
            f"{exc}; mosquitto.log ends: {log_path.read_text(errors='replace')[-600:]}"
        ) from None
    return proc


def start_broker(directory: Path) -> Broker:
    """A private broker on a free port, its persistence in ``directory`` (created)."""
    need("mosquitto")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = directory / "mosquitto.conf"
    # mosquitto started as root drops to user "mosquitto", which could not save its persistence here
    config.write_text(
        f"user {getpass.getuser()}\nlistener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
        f"persistence_location {directory}/\nmax_queued_messages 100000\nmax_inflight_messages 1000\n"
    )
    return Broker("127.0.0.1", port, start_mosquitto(config, port), config)


@dataclass
class SecureBroker:
    broker: Broker
    port: int
    mtls_port: int
    etc: Path

    @property
    def url(self) -> str:
        return f"mqtts://127.0.0.1:{self.port}"

    @property
    def ca(self) -> Path:
        return self.etc / "ca.pem"

    def password_file(self, user: str) -> Path:
        path = self.etc / f"{user}.password"
        path.write_text(USERS[user] + "\n")
        return path

    def ctl_args(self, user: str = "operator", gateway: str = "gw1") -> list[str]:
        """gatewayctl's connection arguments for ``user``."""
        return [
            "--broker",
            self.url,
            "--gateway",
            gateway,
            "--username",
            user,
            "--password-file",
            str(self.password_file(user)),
            "--ca-file",
            str(self.ca),
            "--timeout",
            "5",
        ]

    def stop(self) -> None:
        self.broker.stop()


def start_secure_broker(tmp: Path) -> SecureBroker:
    """mosquitto from deploy/mosquitto/mosquitto.conf with the recipe's passwd and the generated ACL."""
    etc = tmp / "broker-etc"
    etc.mkdir()
    port, mtls_port = free_port(), free_port()
    conf = install_broker_files(etc, etc, port, mtls_port)
    # mosquitto started as root drops to user "mosquitto", which cannot reach this test's files
    config = etc / "mosquitto.conf"
    config.write_text(f"user {getpass.getuser()}\n" + conf)
    broker = Broker("127.0.0.1", port, start_mosquitto(config, port), config)
    return SecureBroker(broker, port, mtls_port, etc)


def install_broker_files(etc: Path, var: Path, port: int, mtls_port: int) -> str:
    """deploy/mosquitto/'s recipes, as its README runs them, into ``etc``: the certificates
    (make_certs.sh: a broker certificate for 127.0.0.1 and localhost, a client certificate for gw1),
    the password file of USERS (make_passwd.sh), the ACL (make_acl.py). Returns the shipped
    mosquitto.conf with these paths, persistence in ``var``, and its two listeners on 127.0.0.1:
    ``port`` (TLS) and ``mtls_port`` (TLS with a client certificate)."""
    need("mosquitto")
    need("mosquitto_passwd")
    make_certs(etc)
    (etc / "users.txt").write_text("".join(f"{u}:{p}\n" for u, p in USERS.items()))
    _run_recipe("make_passwd.sh", str(etc / "users.txt"), str(etc / "passwd"))
    acl_args = ["--operator", "operator", "--gateway", "gw1", "--gateway", "gw2", "--device", "gw1:sensor-1"]
    acl_args += ["--device", "gw1:sensor-000:sim-1"]
    acl = subprocess.run(
        [sys.executable, str(DEPLOY / "make_acl.py"), *acl_args],
        check=True,
        capture_output=True,
        timeout=60,
        text=True,
    )
    (etc / "acl").write_text(acl.stdout)
    conf = (DEPLOY / "mosquitto.conf").read_text()
    conf = conf.replace("/etc/mosquitto/edgefed/", f"{etc}/").replace("/var/lib/mosquitto/", f"{var}/")
    conf = conf.replace("listener 8883", f"listener {port} 127.0.0.1")
    return conf.replace("listener 8884", f"listener {mtls_port} 127.0.0.1")


def make_certs(directory: Path) -> None:
    """deploy/mosquitto/make_certs.sh into ``directory``: a throwaway CA (valid 2 days), a broker
    certificate for 127.0.0.1 and localhost, a client certificate for gw1."""
    need("openssl")
    _run_recipe("make_certs.sh", str(directory), "IP:127.0.0.1,DNS:localhost", "gw1", DAYS="2", CA_DAYS="2")


def _run_recipe(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``sh deploy/mosquitto/<script> args...``; CalledProcessError (with its output) if it fails."""
    return subprocess.run(
        ["sh", str(DEPLOY / script), *args],
        check=True,
        capture_output=True,
        timeout=60,
        text=True,
        env={**os.environ, **env},
    )
