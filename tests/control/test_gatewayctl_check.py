"""``gatewayctl check`` on a box, from the gateway's config file, against a real mosquitto (TLS,
passwords, the ACL), a real cloudd and a real gatewayd: every check passes on a box that is ready,
a running gatewayd is named, and each thing that is wrong is a FAIL (or a WARN) line that says what,
while the others still run."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from gateway.preflight.run import preflight
from tests.harness.broker import SecureBroker, make_certs
from tests.harness.gatewayctl import ctl
from tests.harness.gatewayd import Gatewayd, write_secure_config
from tests.harness.processes import free_port

NAMES = [
    "config",
    "extras",
    "data_dir",
    "lock",
    "disk",
    "http",
    "broker",
    "broker_tls",
    "mqtt_login",
    "cloud",
    "cloud_token",
    "clock",
]


def check(config: Path) -> tuple[int, dict[str, tuple[str, str]], str]:
    """``gatewayctl check --json``: (exit code, name -> (status, detail), stderr)."""
    code, out, err = ctl("--timeout", "5", "--json", "check", "--config", str(config))
    doc = json.loads(out)
    assert doc["ok"] is (code == 0), (code, doc)
    return code, {c["name"]: (c["status"], c["detail"]) for c in doc["checks"]}, err


def good_config(tmp_path: Path, secure_broker: SecureBroker, cloudd) -> tuple[Path, int]:
    """gw1's config for the secure broker and the real cloudd; and its HTTP port."""
    return write_secure_config(tmp_path, secure_broker, cloud_url=cloudd.url, token=cloudd.token_for("gw1"))


def test_a_ready_box_passes_and_a_running_gatewayd_is_named(secure_broker, cloudd, tmp_path):
    config, http_port = good_config(tmp_path, secure_broker, cloudd)
    code, out, err = ctl("check", "--config", str(config))
    assert code == 0, (out, err)
    lines = out.splitlines()
    assert [line.split()[1] for line in lines] == NAMES, out
    assert all(line.split()[0] == "OK" for line in lines), out
    assert "does not exist yet" in out and "TLSv1" in out and "CONNECT as user gw1 accepted" in out, out

    gw = Gatewayd(config, http_port).wait_ready()
    try:
        code, checks, err = check(config)
        assert code == 0, (checks, err)  # a WARN is not a failure
        status, detail = checks["lock"]
        assert status == "WARN" and f"pid {gw.proc.pid}" in detail and "would not start" in detail, detail
        assert checks["http"][0] == "OK" and "in use" in checks["http"][1], checks["http"]
        assert checks["data_dir"] == ("OK", f"{config.parent / 'data-gw1'} exists and is writable")
        assert {name for name, (s, _) in checks.items() if s != "OK"} == {"lock"}, checks
        assert gw.proc.poll() is None, "the check must leave the running gatewayd alone"
    finally:
        gw.kill()


def test_each_fault_is_named_and_the_other_checks_still_run(secure_broker, cloudd, tmp_path):
    good = good_config(tmp_path, secure_broker, cloudd)[0].read_text()
    config = tmp_path / "gw1.toml"

    # the wrong password: TLS is fine, the login is refused
    (tmp_path / "wrong.password").write_text("not-the-password\n")
    config.write_text(good.replace(str(secure_broker.password_file("gw1")), str(tmp_path / "wrong.password")))
    code, checks, _ = check(config)
    assert code == 1 and checks["broker_tls"][0] == "OK", checks
    assert checks["mqtt_login"][0] == "FAIL" and "not authorized" in checks["mqtt_login"][1].lower(), checks
    assert checks["cloud_token"][0] == "OK", checks

    # a CA that did not sign the broker's certificate: TLS fails, the login is not tried
    other = tmp_path / "other-ca"
    other.mkdir()
    make_certs(other)
    config.write_text(good.replace(str(secure_broker.ca), str(other / "ca.pem")))
    code, checks, _ = check(config)
    status, detail = checks["broker_tls"]
    assert code == 1 and status == "FAIL" and "does not verify" in detail and "ca_file" in detail, detail
    assert checks["mqtt_login"] == ("SKIP", "TLS failed"), checks

    # a token cloudd does not know, and a broker that is gone
    config.write_text(
        good.replace(cloudd.token_for("gw1"), "not-a-token").replace(
            secure_broker.url, f"mqtts://127.0.0.1:{free_port()}"
        )
    )
    code, checks, _ = check(config)
    assert code == 1 and checks["broker"][0] == "FAIL" and "Connection refused" in checks["broker"][1]
    assert checks["mqtt_login"][0] == "SKIP", checks
    status, detail = checks["cloud_token"]
    assert status == "FAIL" and "401" in detail and "unauthorized" in detail, detail
    assert checks["cloud"][0] == "OK" and checks["clock"][0] == "OK", checks

    # no cloudd there; a data dir that cannot be made; a log budget larger than the disk
    (tmp_path / "a-file").write_text("")
    config.write_text(
        good.replace(cloudd.url, f"http://127.0.0.1:{free_port()}")
        .replace('data_dir = "data-gw1"', 'data_dir = "a-file/data"')
        .replace("[log]\n", f"[log]\nmax_bytes = {2**60}\n")
    )
    code, checks, _ = check(config)
    assert code == 1 and checks["cloud"][0] == "FAIL", checks
    assert checks["cloud_token"][0] == checks["clock"][0] == "SKIP", checks
    status, detail = checks["data_dir"]
    assert status == "FAIL" and "a-file is not a directory" in detail, detail
    status, detail = checks["disk"]
    assert status == "WARN" and "the disk fills first" in detail and "1024.0 PiB" in detail, detail
    assert checks["mqtt_login"][0] == "OK", checks

    # an invalid file: the one line, naming the field
    config.write_text(good.replace("flush_interval_ms = 20", "flush_interval_ms = -5"))
    code, out, err = ctl("check", "--config", str(config))
    assert code == 1 and out.count("\n") == 1, out
    assert out.startswith("FAIL  config") and "log.flush_interval_ms" in out, out


def test_skew_and_a_missing_extra_are_named(secure_broker, cloudd, tmp_path):
    # faults this box cannot have: a clock a minute fast, an install without torch (both injected)
    config, _ = good_config(tmp_path, secure_broker, cloudd)
    config.write_text(config.read_text().replace("[log]\n", "[training]\nenabled = true\n[log]\n"))
    checks = asyncio.run(
        preflight(config, 5.0, installed=lambda module: module != "torch", clock=lambda: time.time() + 60)
    )
    by_name = {c.name: c for c in checks}
    assert by_name["clock"].status == "WARN" and "60s ahead of cloudd's" in by_name["clock"].detail
    assert by_name["extras"].status == "FAIL", by_name["extras"]
    assert "pip install 'edgefed[train]'" in by_name["extras"].detail and "torch" in by_name["extras"].detail
    assert [c.name for c in checks] == NAMES
