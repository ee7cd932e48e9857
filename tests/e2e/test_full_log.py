"""A full log end to end: real Mosquitto, cloudd and gatewayd, and an outage (cloudd stopped) that
overflows a 64 KiB log budget several times over.

- ``drop_oldest``: the loss is counted exactly (``dropped_records`` is the number of the log's LSNs
  that never reach the cloud, whatever they held: telemetry, the gateway's own sensor results and
  markers, earlier LogGap records), the LogGap records the gateway writes name exactly those LSNs,
  every published message is stored or among them, and the uplink drains and trims to the end
  afterwards (no wedge below the gap).
- ``hold``: nothing is lost: the gateway stops taking and acknowledging messages while the log is
  full, the broker keeps them (its queue holds 100000), and everything arrives once the cloud is back.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest

from devices.sensors import SensorRun, SentRecord, run_sensors
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.poll import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MESSAGES = 1500  # about six times what the 64 KiB budget holds


def publish(broker_url: str) -> SentRecord:
    run = SensorRun(
        broker=broker_url, count=1, rate_hz=1000, duration_s=None, messages=MESSAGES, dropout_probability=0.0
    )
    return run_sensors(run)


@pytest.mark.parametrize("policy", ["drop_oldest", "hold"])
def test_an_outage_overflows_the_log(policy: str, mosquitto, cloudd, tmp_path: Path) -> None:
    extra = (
        f'\n[log]\nsegment_bytes = 16384\nmax_bytes = 65536\nfull_policy = "{policy}"\n'
        '[devices]\nallow = ["sensor-*"]\n'
    )
    config, port = write_config(
        tmp_path, mosquitto.url, cloud_url=cloudd.url, token=cloudd.token_for("gw1"), extra=extra
    )
    gateway = Gatewayd(config, port).wait_ready()
    try:
        cloudd.stop()  # the outage
        sent: list[SentRecord] = []
        sensors = threading.Thread(target=lambda: sent.append(publish(mosquitto.url)))
        sensors.start()
        sensors.join(120)
        assert sent and sent[0].total == MESSAGES
        if policy == "drop_oldest":
            gateway.wait_status(lambda s: s["log"]["dropped_segments"] >= 3, 60, "the log dropped segments")
        else:
            gateway.wait_status(lambda s: s["log"]["holding"] > 0, 60, "the log full, holding")
        cloudd.start()
        final = gateway.wait_status(
            lambda s: (
                s["uplink"]["backlog"] == 0
                and s["log"]["gaps_pending"] == 0
                and s["log"]["holding"] == 0
                and s["log"]["trimmed_lsn"] == s["log"]["durable_lsn"]
            ),
            90,
            "the log drained and trimmed to its end",
        )
        if policy == "hold":  # every published message taken, stored, trimmed
            wait_until(lambda: _telemetry(cloudd.records("gw1")) >= MESSAGES, 60, "all records in the cloud")
            final = gateway.wait_status(
                lambda s: s["log"]["trimmed_lsn"] == s["log"]["durable_lsn"], 30, "trimmed to the end"
            )
    finally:
        gateway.kill()
    stored = [r for r in cloudd.records("gw1") if r.log_id == final["log"]["log_id"]]  # not cloudd's own
    keys = Counter(
        (r.record["device"], r.record["body"]["seq"]) for r in stored if r.record["kind"] == "telemetry"
    )
    assert max(keys.values()) == 1, "a record stored twice"
    published = {(device, seq) for device, seqs in sent[0].sent.items() for seq in seqs}
    assert keys.keys() <= published
    dropped = final["log"]["dropped_records"]
    lsns = {r.lsn for r in stored}
    gaps = [r.record["body"] for r in stored if r.record["body"].get("type") == "log_gap"]
    named = {lsn for gap in gaps for lsn in range(gap["first"], gap["last"] + 1)}
    if policy == "drop_oldest":
        missing = set(range(1, final["log"]["durable_lsn"] + 1)) - lsns
        assert dropped > 0 and dropped == len(missing)  # the loss counted exactly
        assert named == missing  # and the gaps name exactly what is missing
        assert 0 < len(published) - len(keys) <= dropped  # each lost message among the dropped
    else:
        assert dropped == 0 and not gaps and keys.keys() == published  # nothing lost
        assert final["log"]["hold_waits"] > 0


def _telemetry(stored: list) -> int:
    return sum(1 for r in stored if r.record["kind"] == "telemetry")
