"""The uplink against a real cloudd: upload and trim, retry until stored, never drop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.storage.epoch_log import EpochLog
from gateway.uplink.outcome import classify_response
from gateway.uplink.sender import Uplink
from protocol.config import UplinkConfig
from protocol.records import telemetry_record
from tests.harness.cloudd import make_cloudd
from tests.harness.gatewayd import telemetry
from tests.harness.poll import eventually


def config(url: str, token: str, **kw) -> UplinkConfig:
    return UplinkConfig(cloud_url=url, token=token, backoff_initial_s=0.05, backoff_max_s=0.2, **kw)


async def filled_log(directory: Path, n: int, record: bytes | None = None) -> EpochLog:
    log = EpochLog(directory)
    await log.open()
    for i in range(n):
        await log.append(record or telemetry_record("s1", 1000.0 + i, telemetry("s1", i)))
    await log.flush(wait=True)
    return log


async def test_batches_are_uploaded_and_the_log_trimmed(cloudd, tmp_path):
    log = await filled_log(tmp_path / "log", 25)
    uplink = Uplink(log, "gw1", config(cloudd.url, cloudd.token_for("gw1"), batch_max_records=10))
    await uplink.start()
    try:
        uplink.wake()
        await eventually(lambda: log.trimmed_lsn >= 25, 30, "all 25 records acknowledged and trimmed")
        assert uplink.counters["batches_sent"] == 3
        assert uplink.counters["records_uploaded"] == 25
        assert uplink.backlog == 0
        assert [entry async for entry in log.read(1)] == []
    finally:
        await uplink.stop()
        await log.close()


async def test_wrong_token_is_an_auth_failure_and_nothing_is_trimmed(cloudd, tmp_path):
    log = await filled_log(tmp_path / "log", 3)
    uplink = Uplink(log, "gw1", config(cloudd.url, token="wrong"))
    await uplink.start()
    try:
        outcome = await uplink.send_one_batch()
        assert outcome.kind == "auth"
        assert log.trimmed_lsn == 0
    finally:
        await uplink.stop()
        await log.close()


async def test_a_batch_the_cloud_refuses_is_kept_and_reported(cloudd, tmp_path):
    log = await filled_log(tmp_path / "log", 2, record=b'{"not":"a record"}')
    uplink = Uplink(log, "gw1", config(cloudd.url, cloudd.token_for("gw1")))
    await uplink.start()
    try:
        outcome = await uplink.send_one_batch()
        assert outcome.kind == "rejected_by_cloud"
        assert "400" in outcome.detail
        assert log.trimmed_lsn == 0
    finally:
        await uplink.stop()
        await log.close()


async def test_uploads_wait_for_the_cloud_and_then_drain(tmp_path):
    server = make_cloudd(tmp_path / "cloud")  # its port is chosen, nothing listens on it yet
    log = await filled_log(tmp_path / "log", 5)
    uplink = Uplink(log, "gw1", config(server.url, server.token_for("gw1")))
    await uplink.start()
    try:
        uplink.wake()
        await eventually(lambda: uplink.failures["connection"] >= 2, 20, "two failed connection attempts")
        assert log.trimmed_lsn == 0
        await asyncio.to_thread(server.start)
        await eventually(lambda: log.trimmed_lsn >= 5, 30, "the 5 records trimmed once cloudd is up")
    finally:
        await uplink.stop()
        await log.close()
        server.stop()


def test_classify_response():
    ok = classify_response(200, '{"v":1,"stored":2,"duplicates":0,"first_lsn":1,"last_lsn":2}')
    assert ok.kind == "ok" and ok.ack is not None and ok.ack.last_lsn == 2
    assert classify_response(200, "{}").kind == "bad_ack"
    assert classify_response(401, "").kind == "auth"
    assert classify_response(403, "").kind == "auth"
    bad = classify_response(400, '{"error":"invalid","detail":"records.0.lsn: too small"}')
    assert bad.kind == "rejected_by_cloud" and "records.0.lsn" in bad.detail
    assert classify_response(503, "").kind == "server_error"
    busy = classify_response(503, '{"error":"busy"}', "1")  # a busy cloudd says when it has room
    assert (busy.kind, busy.retry_after_s) == ("server_error", 1.0)
    assert classify_response(503, "", "Wed, 21 Oct 2026 07:28:00 GMT").retry_after_s is None
    assert classify_response(500, "", "1").retry_after_s is None
    assert classify_response(404, "nope").kind == "unexpected_status"
