"""Damage in a running gateway's log reaches the operator: ``gatewayctl log verify`` (exit 4, naming
the segment and byte), /status (``log.damage``, ``log.scrub``, ``uplink.corruption``), /metrics and
the daemon's log; the background scrub finds it on its own (docs/storage.md, "Damage")."""

from __future__ import annotations

import asyncio
from pathlib import Path

from protocol.records import telemetry_record
from tests.harness.gatewayctl import broker_args, ctl
from tests.harness.gatewayd import Gatewayd, telemetry, write_config
from tests.storage.storagetest_damage import filled_log, first_lsn, flip_payload, segments

LOG = "\n[log]\nsegment_bytes = 4096\nmax_bytes = 65536\nscrub_interval_s = 0.5\nscrub_rate_Bps = 65536\n"


def sample(lsn: int) -> bytes:
    return telemetry_record("s1", 1000.0 + lsn, telemetry("s1", lsn))


async def prepare(directory: Path) -> None:
    """A log from an earlier run: 60 telemetry records the cloud has not had (several segments)."""
    log = await filled_log(directory, 60, make=sample)
    await log.close()


def test_damage_is_shown_by_log_verify_status_metrics_and_the_log(mosquitto, tmp_path):
    log_dir = tmp_path / "data-gw1" / "log"
    asyncio.run(prepare(log_dir))
    config, http_port = write_config(tmp_path, mosquitto.url, extra=LOG)  # the cloud is not reachable
    gw = Gatewayd(config, http_port).wait_ready()
    try:
        code, out, err = ctl(*broker_args(mosquitto.url, timeout_s=10), "log", "verify")
        assert code == 0 and out.startswith("log verified: ") and "no damage" in out, (code, out, err)

        victim = first_lsn(segments(log_dir)[1]) + 2
        segment, offset = flip_payload(log_dir, victim, make=sample)  # under the running daemon
        code, out, err = ctl(*broker_args(mosquitto.url, timeout_s=10), "log", "verify")
        assert code == 4 and f"{segment} byte {offset} (from lsn {victim})" in out, (code, out, err)

        def reported(status: dict) -> bool:
            scrubbed = status["log"]["scrub"]["last"]
            corruption = status["uplink"]["corruption"]
            return bool(scrubbed and scrubbed["damage"] and corruption and corruption["lsn"] == victim)

        status = gw.wait_status(reported, 30, "the uplink stopped at the damage, a background pass found it")
        assert status["log"]["corruptions"] == 1 and status["log"]["scrub_passes"] >= 2
        assert [(d["segment"], d["offset"]) for d in status["log"]["damage"]] == [(str(segment), offset)]
        assert status["log"]["trimmed_lsn"] < victim
        metrics = gw.get("/metrics").decode()
        assert "edgefed_gateway_log_corruptions_total 1.0" in metrics
        assert f"edgefed_gateway_uplink_stopped_at_lsn {float(victim)}" in metrics
        assert "edgefed_gateway_log_scrub_last_damage 1.0" in metrics
        output = gw.output()
        assert f"corruption: corrupt at {segment} byte {offset}, from lsn {victim}" in output
        assert f"uplink: stopped at lsn {victim}" in output
        rc, output = gw.terminate()
        assert rc == 0, output[-2000:]
    finally:
        gw.kill()
