"""A running gatewayd reports to cloudd's fleet view: online with its backlog, link and placement while
it heartbeats; offline once it stops."""

from __future__ import annotations

from tests.harness.cloud_http import call
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.poll import wait_until


def fleet(cloudd) -> dict:
    status, doc = call(f"{cloudd.url}/v1/fleet", cloudd.operator_token)
    assert status == 200, doc
    return {g["id"]: g for g in doc["gateways"]}


def test_gateway_heartbeats_show_in_the_fleet(mosquitto, cloudd, tmp_path):
    config, port = write_config(
        tmp_path,
        mosquitto.url,
        cloud_url=cloudd.url,
        token=cloudd.token_for("gw1"),
        extra="heartbeat_interval_s = 0.5\n",
    )
    gateway = Gatewayd(config, port).wait_ready()
    try:
        wait_until(lambda: fleet(cloudd)["gw1"]["online"], 30, "gw1 online in the fleet")
        wait_until(lambda: fleet(cloudd)["gw1"]["placement"], 30, "gw1's placement in the fleet")
        row = fleet(cloudd)["gw1"]
        assert row["backlog_records"] == 0
        assert {d["where"] for d in row["placement"]} <= {"gateway", "cloud"}
        assert gateway.status()["heartbeat"]["sent"] >= 1
    finally:
        gateway.kill()
    wait_until(lambda: not fleet(cloudd)["gw1"]["online"], 30, "gw1 offline after it stopped")
