"""A sample the broker delivers twice is logged once (gateway/ingest/recent_samples.py), also across
a restart."""

from __future__ import annotations

import asyncio

from gateway.ingest.recent_samples import RecentSamples
from tests.gateway.test_gatewayd import log_records
from tests.harness.gatewayd import Gatewayd, telemetry, write_config
from tests.harness.mqtt import publish
from tests.harness.poll import wait_until


def test_window_forgets_oldest_first():
    recent = RecentSamples(capacity=3)
    for seq in range(5):
        recent.remember(("s", seq, float(seq)))
    assert len(recent) == 3
    assert ("s", 1, 1.0) not in recent and ("s", 4, 4.0) in recent


def test_seed_reads_telemetry_records():
    async def records():
        yield (
            1,
            (
                b'{"v":1,"kind":"telemetry","device":"s","received_ts":1.0,'
                b'"body":{"device":"s","seq":7,"ts":2.5}}'
            ),
        )
        yield 2, b'{"v":1,"kind":"event","device":"s","received_ts":1.0,"body":{}}'

    recent = RecentSamples()
    assert asyncio.run(recent.seed(records())) == 1
    assert ("s", 7, 2.5) in recent


def test_same_sample_twice_is_logged_once_also_after_restart(mosquitto, tmp_path):
    config, port = write_config(tmp_path, mosquitto.url)
    topic = "edgefed/gw1/devices/sensor-1/telemetry"
    gateway = Gatewayd(config, port).wait_ready()
    try:
        publish(mosquitto.port, [(topic, telemetry("sensor-1", seq)) for seq in (0, 1, 0, 1, 2)])
        wait_until(lambda: gateway.status()["ingest"]["acked"] == 5, 20, "5 messages acked")
        assert gateway.status()["ingest"]["accepted"] == 3
        assert gateway.status()["ingest"]["redelivered"] == 2
    finally:
        gateway.kill()
    gateway = Gatewayd(config, port).wait_ready()  # the window is seeded from the log
    try:
        publish(mosquitto.port, [(topic, telemetry("sensor-1", seq)) for seq in (2, 3)])
        wait_until(lambda: gateway.status()["ingest"]["acked"] == 2, 20, "2 messages acked")
        assert gateway.status()["ingest"]["accepted"] == 1
    finally:
        gateway.kill()
    assert len(asyncio.run(log_records(tmp_path / "data-gw1"))) == 4
