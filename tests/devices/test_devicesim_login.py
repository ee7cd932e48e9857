"""devicesim's sensors log in as a real device does: a password over TLS (``--username``,
``--password-file``, ``--ca-file``) or a client certificate as well (``--cert-file``, ``--key-file``,
mutual TLS), against mosquitto as deploy/mosquitto/ configures it, and what they send reaches a real
gatewayd. A refused login, an unverified broker or a plain URL to a TLS port is one line and exit 1
that says so, not a run that waits on acks that never come."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness.broker import SecureBroker
from tests.harness.gatewayd import Gatewayd, write_secure_config
from tests.harness.processes import run_module


def devicesim(sb: SecureBroker, tmp_path: Path, *login: str, messages: int = 3) -> tuple[int, str, int]:
    """One sensor (sensor-000, user sim-1) sending ``messages`` to gw1: (exit code, stderr, the count
    the broker acknowledged)."""
    record = tmp_path / "sent.json"
    record.unlink(missing_ok=True)
    args = ["sensors", "--count", "1", "--messages", str(messages), "--duration", "0", "--rate", "20"]
    args += ["--dropout", "0", "--record", str(record), *login]
    done = run_module("devices.cli", args, timeout_s=60)
    sent = json.loads(record.read_text())["total"] if record.exists() else 0
    return done.returncode, done.stderr, sent


def test_password_over_tls_and_mutual_tls_reach_the_gateway(secure_broker, tmp_path):
    sb = secure_broker
    config, http_port = write_secure_config(tmp_path, sb, mtls=True)
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        password = ["--username", "sim-1", "--password-file", str(sb.password_file("sim-1"))]
        code, err, sent = devicesim(sb, tmp_path, "--broker", sb.url, *password, "--ca-file", str(sb.ca))
        assert (code, sent) == (0, 3), err
        gw.wait_status(lambda s: s["ingest"]["accepted"] == 3, 20, "the 3 messages sent over TLS accepted")
        mtls = [f"--broker=mqtts://127.0.0.1:{sb.mtls_port}", *password, "--ca-file", str(sb.ca)]
        mtls += ["--cert-file", str(sb.etc / "gw1.pem"), "--key-file", str(sb.etc / "gw1.key")]
        code, err, sent = devicesim(sb, tmp_path, *mtls, messages=2)
        assert (code, sent) == (0, 2), err
        gw.wait_status(lambda s: s["ingest"]["accepted"] == 5, 20, "2 more sent over mutual TLS accepted")
        assert gw.status()["ingest"]["rejected"] == 0
    finally:
        gw.kill()


def test_refused_login_and_unverified_broker_are_one_line(secure_broker, tmp_path):
    sb = secure_broker
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password\n")
    login = ["--broker", sb.url, "--username", "sim-1", "--ca-file", str(sb.ca)]
    code, err, sent = devicesim(sb, tmp_path, *login, "--password-file", str(wrong))
    assert (code, sent) == (1, 0) and "broker refused: Not authorized" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    # no --ca-file: the system's CAs do not know this broker's throwaway CA
    password = ["--username", "sim-1", "--password-file", str(sb.password_file("sim-1"))]
    code, err, sent = devicesim(sb, tmp_path, "--broker", sb.url, *password)
    assert (code, sent) == (1, 0) and "certificate verify failed" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    # mutual TLS without a client certificate: the broker ends the connection
    mtls = ["--broker", f"mqtts://127.0.0.1:{sb.mtls_port}", *password, "--ca-file", str(sb.ca)]
    code, err, sent = devicesim(sb, tmp_path, *mtls)
    assert (code, sent) == (1, 0) and "require a client certificate (--cert-file, --key-file)?" in err, err
    # plain MQTT to the TLS listener
    code, err, sent = devicesim(sb, tmp_path, f"--broker=mqtt://127.0.0.1:{sb.port}", *password)
    assert (code, sent) == (1, 0), err
    assert err.strip().endswith(f"the broker at 127.0.0.1:{sb.port} may expect TLS: use mqtts://"), err


def test_login_flags_that_cannot_work_are_usage_errors(tmp_path):
    password = tmp_path / "password"
    password.write_text("secret\n")
    for args, says in [
        (["--password-file", str(password)], "--password-file needs --username"),
        (["--username", "u", "--ca-file", str(password)], "--ca-file: for an mqtts:// broker"),
        (["--broker", "mqtts://h:8883", "--cert-file", str(password)], "--cert-file and --key-file go"),
    ]:
        done = run_module("devices.cli", ["sensors", *args], timeout_s=30)
        assert done.returncode == 2 and says in done.stderr, done.stderr
