"""Helpers for control-plane tests: a secure mosquitto built from deploy/mosquitto/, gateway configs
that log in to it, and gatewayctl run in-process."""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import Broker, _start_mosquitto, free_port

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "mosquitto"
USERS = {"operator": "op-secret", "gw1": "gw1-secret", "sensor-1": "dev-secret", "gw2": "gw2-secret"}


def need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is not installed; the control-plane tests need it")


def make_certs(directory: Path) -> None:
    """A throwaway CA, a broker certificate for 127.0.0.1, and a client certificate for gw1 (openssl CLI)."""
    need("openssl")
    d = directory

    def run(*cmd: str) -> None:
        subprocess.run(cmd, cwd=d, check=True, capture_output=True, timeout=60)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run(
        "openssl",
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=edgefed-test-ca",
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, cn in (("server", "127.0.0.1"), ("gw1", "gw1")):
        run("openssl", "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        run(
            "openssl",
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            *(["-extfile", "san.ext"] if name == "server" else []),
        )


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


def start_secure_broker(tmp: Path) -> SecureBroker:
    """mosquitto from deploy/mosquitto/mosquitto.conf with the recipe's passwd and the generated ACL."""
    need("mosquitto")
    need("mosquitto_passwd")
    etc = tmp / "broker-etc"
    etc.mkdir()
    make_certs(etc)
    (etc / "users.txt").write_text("".join(f"{u}:{p}\n" for u, p in USERS.items()))
    subprocess.run(
        ["sh", str(DEPLOY / "make_passwd.sh"), str(etc / "users.txt"), str(etc / "passwd")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    acl = subprocess.run(
        [
            sys.executable,
            str(DEPLOY / "make_acl.py"),
            "--operator",
            "operator",
            "--gateway",
            "gw1",
            "--gateway",
            "gw2",
            "--device",
            "gw1:sensor-1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
        text=True,
    )
    (etc / "acl").write_text(acl.stdout)
    port, mtls_port = free_port(), free_port()
    conf = (DEPLOY / "mosquitto.conf").read_text()
    conf = conf.replace("/etc/mosquitto/edgefed/", f"{etc}/").replace("/var/lib/mosquitto/", f"{etc}/")
    conf = conf.replace("listener 8883", f"listener {port} 127.0.0.1")
    conf = conf.replace("listener 8884", f"listener {mtls_port} 127.0.0.1")
    # mosquitto started as root drops to user "mosquitto", which cannot read this test's 0600 files
    conf = f"user {getpass.getuser()}\n" + conf
    config = etc / "mosquitto.conf"
    config.write_text(conf)
    broker = Broker("127.0.0.1", port, _start_mosquitto(config, port), config)
    return SecureBroker(broker, port, mtls_port, etc)


def gateway_config(
    tmp: Path,
    sb: SecureBroker,
    http_port: int | None = None,
    extra: str = "",
    mtls: bool = False,
    flush_ms: int = 20,
) -> tuple[Path, int]:
    port = http_port or free_port()
    config = tmp / "gw1.toml"
    broker = f"mqtts://127.0.0.1:{sb.mtls_port}" if mtls else sb.url
    cert = f'cert_file = "{sb.etc}/gw1.pem"\nkey_file = "{sb.etc}/gw1.key"\n' if mtls else ""
    config.write_text(
        f'gateway_id = "gw1"\ndata_dir = "data-gw1"\n{extra}'
        f'[mqtt]\nbroker = "{broker}"\nusername = "gw1"\npassword_file = "{sb.password_file("gw1")}"\n'
        f'ca_file = "{sb.ca}"\n{cert}'
        f"[log]\nflush_interval_ms = {flush_ms}\n"
        f'[http]\nlisten = "127.0.0.1:{port}"\n'
        f'[uplink]\ncloud_url = "http://127.0.0.1:9"\ntoken = "t"\nbackoff_max_s = 1.0\n'
    )
    return config, port


def ctl(*args: str) -> tuple[int, str, str]:
    """gatewayctl's main() in this process: (exit code, stdout, stderr)."""
    from gateway.ctl import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def ctl_json(sb: SecureBroker, *args: str, user: str = "operator") -> dict:
    code, out, err = ctl(*sb.ctl_args(user), *args, "--json")
    assert code == 0, (code, out, err)
    return json.loads(out)
