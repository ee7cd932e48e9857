"""A plain ``mqtt://`` URL that points at a TLS listener says so: gatewayd logs "the broker at
HOST:PORT may expect TLS: use mqtts://" once however often it retries, and gatewayctl's one line
says the same; the probe behind it (runtime/tls_probe.py) answers True only for a server that
speaks TLS. Against mosquitto as deploy/mosquitto/ configures it."""

from __future__ import annotations

import pytest

from runtime.tls_probe import speaks_tls
from tests.harness.gatewayctl import ctl
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.processes import free_port, wait_for_port


def test_the_probe_tells_tls_listeners_from_plain_mqtt(secure_broker, mosquitto):
    assert speaks_tls("127.0.0.1", secure_broker.port)
    assert speaks_tls("127.0.0.1", secure_broker.mtls_port)  # refuses the handshake, in TLS
    assert not speaks_tls("127.0.0.1", mosquitto.port)
    assert not speaks_tls("127.0.0.1", free_port())  # nothing listens


def test_gatewayd_on_mqtt_url_to_a_tls_port_logs_the_hint_once(secure_broker, tmp_path):
    sb = secure_broker
    url = f"mqtt://127.0.0.1:{sb.port}"
    password = f'username = "gw1"\npassword_file = "{sb.password_file("gw1")}"\n'
    config, http_port = write_config(tmp_path, url, mqtt=password)
    gw = Gatewayd(config, http_port)
    try:
        wait_for_port(http_port, proc=gw.proc)
        gw.wait_status(lambda s: s["mqtt"]["connect_failures"] >= 4, 30, "4 failed connects (retries)")
        hints = [line for line in gw.output().splitlines() if "may expect TLS" in line]
        assert len(hints) == 1, gw.output()[-3000:]
        assert hints[0].endswith(f"mqtt: the broker at 127.0.0.1:{sb.port} may expect TLS: use mqtts://")
        assert gw.status()["mqtt"]["connected"] == 0
    finally:
        gw.kill()


@pytest.mark.parametrize("listener", ["tls", "mtls"])
def test_gatewayctl_on_mqtt_url_to_a_tls_port_says_use_mqtts(secure_broker, listener):
    sb = secure_broker
    port = sb.port if listener == "tls" else sb.mtls_port
    args = sb.ctl_args()
    args[args.index("--broker") + 1] = f"mqtt://127.0.0.1:{port}"
    code, out, err = ctl(*args, "status")
    assert code == 2 and out == "", (code, out, err)
    assert err.strip().splitlines() == [
        f"gatewayctl: cannot connect to broker mqtt://127.0.0.1:{port}: disconnected before CONNACK: "
        f"Unspecified error; the broker at 127.0.0.1:{port} may expect TLS: use mqtts://"
    ], err


def test_no_hint_when_the_broker_answers(secure_broker, tmp_path):
    """A refused login is the broker's answer, over the right protocol: nothing about TLS."""
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    args = secure_broker.ctl_args()
    args[args.index("--password-file") + 1] = str(wrong)
    code, _, err = ctl(*args, "status")
    assert code == 2 and "Not authorized" in err and "TLS" not in err, err
