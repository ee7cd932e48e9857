"""The uplink at damage in the log, against a real cloudd: it uploads what is before the damage and
stops there, never uploading or trimming past it, also in the rounds after it; it says so
(``damage_stop``, ``stopped_at_lsn``; /status in tests/gateway/test_log_damage.py) (docs/storage.md,
"Damage")."""

from __future__ import annotations

from pathlib import Path

from gateway.uplink.sender import Uplink
from protocol.config import UplinkConfig
from protocol.records import telemetry_record
from tests.harness.gatewayd import telemetry
from tests.storage.storagetest_damage import filled_log, first_lsn, flip_payload, segments


def sample(lsn: int) -> bytes:
    return telemetry_record("s1", 1000.0 + lsn, telemetry("s1", lsn))


async def test_the_uplink_uploads_up_to_damage_and_never_past_it(cloudd, tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log = await filled_log(directory, 90, make=sample)
    victim = first_lsn(segments(directory)[1]) + 4
    segment, offset = flip_payload(directory, victim, make=sample)
    config = UplinkConfig(
        cloud_url=cloudd.url,
        token=cloudd.token_for("gw1"),
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        batch_max_records=10,
    )
    uplink = Uplink(log, "gw1", config)
    await uplink.start(run=False)  # rounds driven here, one batch each

    def stored() -> list[int]:
        return sorted(r.lsn for r in cloudd.records("gw1") if r.log_id == log.log_id)

    try:
        for _ in range(victim // 10 + 3):  # enough rounds for every batch before the damage, and more
            assert (await uplink.send_one_batch()).kind == "ok"
        assert stored() == list(range(1, victim)) and log.trimmed_lsn == victim - 1
        for lsn in range(91, 96):  # live records after the damage wait too
            await log.append(sample(lsn))
        await log.flush(wait=True)
        for _ in range(3):
            assert (await uplink.send_one_batch()).kind == "ok"
        assert stored() == list(range(1, victim)) and log.trimmed_lsn == victim - 1
        assert uplink.damage_stop.status() == {
            "kind": "corrupt",
            "segment": str(segment),
            "offset": offset,
            "detail": uplink.damage_stop.status()["detail"],
            "lsn": victim,
        }
        assert uplink.figures["stopped_at_lsn"] == victim and uplink.figures["corruption_stops"] == 1
        assert log.stats()["corruptions"] == 1
    finally:
        await uplink.stop()
        await log.close()
