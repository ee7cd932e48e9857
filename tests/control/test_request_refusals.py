"""A live gatewayd refuses loosely typed and retained control requests: each is answered with the
field named, counted by reason, and changes nothing."""

from __future__ import annotations

import json

from tests.harness.gatewayctl import broker_args, ctl
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.mqtt import publish
from tests.harness.poll import wait_until


def test_loose_types_and_a_live_retained_request_are_refused_and_change_nothing(mosquitto, tmp_path):
    config, http_port = write_config(tmp_path, mosquitto.url)
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        wait_until(lambda: gw.status()["control"]["births"] >= 1, 20, "control plane subscribed")
        for patch in ('{"enabled": "yes"}', '{"enabled": 1}'):  # not booleans, whatever they look like
            code, out, err = ctl(*broker_args(mosquitto.url), "config", "patch", "sensor", patch)
            assert code != 0 and "refused (invalid): patch.enabled:" in err, (code, out, err)
        # Retained, and published while the gateway is connected, so the broker delivers it live: it
        # must be refused all the same, or it would run again on every reconnect.
        request = json.dumps({"device": "intruder-*"}).encode()
        publish(mosquitto.port, [("edgefed/gw1/control/request/device.add", request)], retain=True)
        status = gw.wait_status(
            lambda s: s["control"]["refused_by_reason"].get("retained") == 1,
            20,
            "the retained request refused",
        )
        assert status["control"]["refused_by_reason"]["invalid"] == 2
        assert status["control"]["revision"] == 0 and status["control"]["changes"] == 0
        code, out, err = ctl(*broker_args(mosquitto.url), "devices")
        assert code == 0 and "allow: * (" in out, (out, err)
    finally:
        gw.kill()
