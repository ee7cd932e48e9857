"""The uplink against a real cloudd: priority drain of a backlog with non-contiguous LSNs, trim only
over the acknowledged prefix, live data interleaved, retry on link-up, the bandwidth cap, and the
link monitor fed by real uploads."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from gateway.placement import LinkMonitor
from gateway.storage.epoch_log import EpochLog
from gateway.uplink.drain import classify
from gateway.uplink.sender import Uplink
from protocol.config import UplinkConfig
from protocol.records import Record, encode_record
from tests.harness.cloudd import make_cloudd
from tests.harness.poll import eventually

pytestmark = pytest.mark.timeout(120)


def record(lsn: int, n: int = 0) -> bytes:
    """LSN-determined mix: every 10th an alert, every 3rd a summary, the rest raw telemetry."""
    if lsn % 10 == 0:
        return encode_record(
            Record(
                kind="event",
                device="cam-1",
                received_ts=float(lsn),
                body={"severity": "alert", "i": lsn, "n": n},
            )
        )
    if lsn % 3 == 0:
        return encode_record(
            Record(
                kind="event",
                device="sensor-1",
                received_ts=float(lsn),
                body={"severity": "info", "mean": 1.0, "i": lsn, "n": n},
            )
        )
    return encode_record(
        Record(kind="telemetry", device="sensor-1", received_ts=float(lsn), body={"seq": lsn, "n": n})
    )


async def filled_log(directory: Path, n: int) -> EpochLog:
    log = EpochLog(directory, segment_bytes=64 * 1024, max_bytes=64 << 20)
    await log.open()
    for i in range(1, n + 1):
        await log.append(record(i))
    await log.flush(wait=True)
    return log


def config(url: str, token: str, **kw) -> UplinkConfig:
    base = {
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.2,
        "batch_max_records": 4,
        "backlog_threshold_records": 5,
    }
    return UplinkConfig(cloud_url=url, token=token, **{**base, **kw})


async def test_backlog_drains_by_class_and_trims_only_the_acknowledged_prefix(cloudd, tmp_path):
    log = await filled_log(tmp_path / "log", 30)  # alerts 10,20,30; summaries 3,6,9,12,...
    uplink = Uplink(
        log,
        "gw1",
        config(
            cloudd.url,
            cloudd.token_for("gw1"),
            drain_alerts="newest",
            drain_summaries="oldest",
            drain_raw="oldest",
        ),
    )
    await uplink.start(run=False)
    try:
        assert (await uplink.send_one_batch()).kind == "ok"  # alerts: 10, 20, 30
        assert uplink.chooser.uploaded_by_class == {"alert": 3, "summary": 0, "raw": 0}
        assert log.trimmed_lsn == 0  # LSN 1 is not acknowledged: nothing may be trimmed
        assert (await uplink.send_one_batch()).kind == "ok"  # summaries 3, 6, 9, 12
        assert log.trimmed_lsn == 0
        await log.append(record(31, n=1))  # live data arrives during the drain
        await log.flush(wait=True)
        assert (await uplink.send_one_batch()).kind == "ok"  # the live tail's turn
        assert uplink.chooser.counters["live_batches"] == 1 and log.trimmed_lsn == 0
        for _ in range(20):
            if uplink.backlog == 0:
                break
            assert (await uplink.send_one_batch()).kind == "ok"
        assert uplink.backlog == 0 and log.trimmed_lsn == 31
        assert uplink.chooser.uploaded_by_class == {"alert": 3, "summary": 9, "raw": 19}
    finally:
        await uplink.stop()
        await log.close()
    stored = cloudd.records("gw1")
    assert sorted(r.lsn for r in stored) == list(range(1, 32))  # each once
    order = [classify(encode_record(Record.model_validate(r.record))) for r in stored if r.lsn <= 30]
    # storage order is arrival order: every alert before any summary, every summary before raw
    assert order == sorted(order, key=["alert", "summary", "raw"].index)


async def test_a_backlog_does_not_hold_up_live_records(cloudd, tmp_path):
    log = await filled_log(tmp_path / "log", 3000)
    uplink = Uplink(
        log,
        "gw1",
        config(cloudd.url, cloudd.token_for("gw1"), batch_max_records=100, backlog_threshold_records=200),
    )
    await uplink.start()
    try:
        await eventually(
            lambda: uplink.chooser.counters["backlog_batches"] >= 1, 60, "a first backlog batch sent"
        )
        first_live = log.durable_lsn + 1
        for i in range(50):  # live records, appended at once while most of the backlog still waits
            await log.append(record(first_live + i, n=2))
        await log.flush(wait=True)
        uplink.wake()
        await eventually(lambda: uplink.backlog == 0, 60, "the backlog and the live records drained")
        assert log.trimmed_lsn == log.durable_lsn
    finally:
        await uplink.stop()
        await log.close()
    stored = cloudd.records("gw1")
    lsns = [r.lsn for r in stored]
    assert Counter(lsns).most_common(1)[0][1] == 1 and len(lsns) == 3050
    # the last live record was stored before the backlog's last raw record: live data interleaves
    position = {lsn: i for i, lsn in enumerate(lsns)}
    assert position[first_live + 49] < max(position[lsn] for lsn in range(1, 3001) if lsn % 10 and lsn % 3)


async def test_retry_as_soon_as_the_link_returns_and_the_monitor_hears_uploads(tmp_path):
    cloud = make_cloudd(tmp_path / "cloud")  # its port is chosen, nothing listens on it yet
    log = await filled_log(tmp_path / "log", 3)
    monitor = LinkMonitor(down_after_failures=1, min_goodput_bytes=1)
    uplink = Uplink(
        log,
        "gw1",
        config(cloud.url, cloud.token_for("gw1"), backoff_initial_s=60.0, backoff_max_s=60.0),
        monitor=monitor,
    )
    monitor.add_listener(uplink.link_changed)
    await uplink.start()
    try:
        await eventually(lambda: uplink.failures["connection"] >= 1, 20, "a failed upload (nothing listens)")
        assert monitor.snapshot().state == "down"  # the failed upload was reported
        await asyncio.to_thread(cloud.start)
        # The uplink must not sleep out its 60 s backoff: a failure on the link is retried within 1 s
        # whatever the monitor says, and at once when a probe says the link is back (which of the two
        # comes first is a race: cloudd may answer a retry before the probe is made).
        monitor.observe_probe(0.01)
        await eventually(lambda: log.trimmed_lsn == 3, 20, "the 3 records uploaded and trimmed")
        assert uplink.failures["connection"] + uplink.failures["timeout"] >= 1
        assert monitor.snapshot().goodput_measured  # real uploads fed the goodput estimate
    finally:
        await uplink.stop()
        await log.close()
        await asyncio.to_thread(cloud.stop)


async def test_bandwidth_cap_throttles(cloudd, tmp_path):
    log = await filled_log(tmp_path / "log", 40)
    uplink = Uplink(
        log,
        "gw1",
        config(
            cloudd.url,
            cloudd.token_for("gw1"),
            batch_max_records=10,
            backlog_threshold_records=1000,
            bandwidth_cap_Bps=4000,
            bandwidth_burst_bytes=1024,
            compress_level=0,  # the cap counts bytes on the wire: gzipped, these batches fit its burst
        ),
    )
    await uplink.start()
    try:
        await eventually(lambda: log.trimmed_lsn == 40, 60, "all 40 records uploaded and trimmed")
        assert uplink.counters["throttled_s"] > 0
    finally:
        await uplink.stop()
        await log.close()


async def test_a_live_tail_past_the_threshold_joins_the_backlog(cloudd, tmp_path):
    """More live records than the threshold wait (the link is not keeping up): they join the backlog,
    so the alert among them goes before the raw records that waited longer."""
    log = await filled_log(tmp_path / "log", 30)
    uplink = Uplink(log, "gw1", config(cloudd.url, cloudd.token_for("gw1")))  # threshold 5, 4 per batch
    await uplink.start(run=False)
    try:
        assert (await uplink.send_one_batch()).kind == "ok"  # the scan, then the alerts
        for i in range(31, 43):  # 12 live records, over the threshold; 40 is an alert
            await log.append(record(i, n=3))
        await log.flush(wait=True)
        assert (await uplink.send_one_batch()).kind == "ok"
        assert uplink.chooser.status()["backlog_upto"] == 42
        for _ in range(30):
            if uplink.backlog == 0:
                break
            assert (await uplink.send_one_batch()).kind == "ok"
        assert uplink.backlog == 0 and log.trimmed_lsn == 42
    finally:
        await uplink.stop()
        await log.close()
    lsns = [r.lsn for r in cloudd.records("gw1")]
    assert sorted(lsns) == list(range(1, 43))
    raw_left = [lsn for lsn in lsns[lsns.index(40) :] if lsn % 10 and lsn % 3]
    assert len(raw_left) == sum(1 for lsn in range(1, 43) if lsn % 10 and lsn % 3)  # 40 before every raw


@pytest.mark.parametrize("level", [0, 1, 9])
async def test_batch_bodies_go_gzipped_and_cloudd_stores_each_record_once(cloudd, tmp_path, level):
    """``uplink.compress_level``: the bodies go with Content-Encoding: gzip (cloudd's server
    decompresses them), the wire counts fewer bytes than the JSON it carries, and 0 sends them plain."""
    log = await filled_log(tmp_path / "log", 200)
    uplink = Uplink(
        log,
        "gw1",
        config(cloudd.url, cloudd.token_for("gw1"), batch_max_records=50, compress_level=level),
    )
    await uplink.start()
    try:
        await eventually(lambda: uplink.backlog == 0, 60, "the log drained")
    finally:
        await uplink.stop()
        await log.close()
    assert sorted(r.lsn for r in cloudd.records("gw1")) == list(range(1, 201))  # each once
    wire, encoded = uplink.figures["bytes_uploaded"], uplink.figures["bytes_encoded"]
    if level == 0:
        assert wire == encoded > 0
    else:
        assert 0 < wire < encoded / 3, (wire, encoded)
