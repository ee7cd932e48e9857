"""The uplink through an outage, against a real cloudd: everything written while the cloud was
unreachable is backlog (alerts acknowledged before the raw data of the same period), and a full log
under "drop_oldest" neither wedges the uplink nor miscounts: the loss is exact and LogGap records
name exactly the LSNs that never arrive; a request stuck in a black hole is reported as a stall,
the link is called down long before the request's timeout, and the request is abandoned when the
link returns."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.placement.link import LinkMonitor
from gateway.placement.probe import LinkProber
from gateway.storage.epoch_log import EpochLog
from gateway.uplink.blobs import BlobSpool, blob_record
from gateway.uplink.sender import Uplink
from protocol.config import UplinkConfig
from tests.harness.cloudd import make_cloudd
from tests.harness.faultproxy import FaultProxy
from tests.harness.poll import eventually
from tests.uplink.test_uplink_drain import record

pytestmark = pytest.mark.timeout(120)


def config(url: str, token: str, **kw) -> UplinkConfig:
    base = {"backoff_initial_s": 0.05, "backoff_max_s": 30.0, "batch_max_records": 20}
    return UplinkConfig(cloud_url=url, token=token, **{**base, **kw})


def gap_runs(stored) -> list[tuple[int, int]]:
    bodies = [r.record["body"] for r in stored]
    return sorted((b["first"], b["last"]) for b in bodies if b.get("type") == "log_gap")


async def test_alerts_written_during_an_outage_go_before_its_raw_data(tmp_path):
    cloud = make_cloudd(tmp_path / "cloud")  # nothing listens on its port yet: the outage
    log = EpochLog(tmp_path / "log", segment_bytes=64 * 1024, max_bytes=64 << 20)
    await log.open()
    # backoff_max_s is 30 s: only the short outage retry lets the uplink notice the cloud within the test
    uplink = Uplink(log, "gw1", config(cloud.url, cloud.token_for("gw1")))
    await uplink.start()
    try:
        for lsn in range(1, 401):  # written over the outage, the uplink failing all along
            await log.append(record(lsn))
            if lsn % 50 == 0:
                await log.flush(wait=True)
                uplink.wake()
                await eventually(lambda n=lsn: uplink.failures["connection"] >= n // 50, 20, "a failure")
        await log.flush(wait=True)
        await asyncio.to_thread(cloud.start)
        await eventually(lambda: log.trimmed_lsn == 400, 60, "the outage's records uploaded and trimmed")
        assert uplink.chooser.counters["absorbed_into_backlog"] > 0
    finally:
        await uplink.stop()
        await log.close()
        await asyncio.to_thread(cloud.stop)
    lsns = [r.lsn for r in cloud.records("gw1")]
    assert sorted(lsns) == list(range(1, 401))  # each once
    alerts = [i for i, lsn in enumerate(lsns) if lsn % 10 == 0]
    raw = [i for i, lsn in enumerate(lsns) if lsn % 10 and lsn % 3]
    assert max(alerts) < min(raw)  # every alert of the outage stored before any of its raw data


async def test_drop_oldest_through_an_outage_counts_exactly_and_names_the_gaps(tmp_path):
    cloud = make_cloudd(tmp_path / "cloud")
    await asyncio.to_thread(cloud.start)
    log = EpochLog(tmp_path / "log", segment_bytes=8192, max_bytes=32768, full_policy="drop_oldest")
    await log.open()
    uplink = Uplink(log, "gw1", config(cloud.url, cloud.token_for("gw1")))
    await uplink.start()
    appended = 0
    try:
        for lsn in range(1, 20):  # uploaded before the outage
            await log.append(record(lsn))
        await log.flush(wait=True)
        uplink.wake()
        await eventually(lambda: log.trimmed_lsn >= 19, 20, "the first records uploaded")
        await asyncio.to_thread(cloud.stop)
        appended = 19
        while log.stats()["dropped_segments"] < 3:  # overflow the 32 kB budget several times
            appended += 1
            await log.append(record(appended))
            if appended % 20 == 0:
                await log.flush(wait=True)
        await log.flush(wait=True)
        await asyncio.to_thread(cloud.start)
        uplink.link_changed(True)
        # trimmed to the end (no wedge below a gap); the last trim may still be on its way when the
        # backlog reads 0 (acknowledged runs are booked before the trim's await)
        await eventually(
            lambda: uplink.backlog == 0 and not log.gaps and log.trimmed_lsn == log.durable_lsn,
            60,
            "the log drained and trimmed to the end after the drops",
        )
        dropped = log.stats()["dropped_records"]
    finally:
        await uplink.stop()
        await log.close()
        await asyncio.to_thread(cloud.stop)
    stored = cloud.records("gw1")
    ours = {r.lsn for r in stored if r.record["body"].get("type") != "log_gap"}
    missing = set(range(1, appended + 1)) - ours
    assert dropped == len(missing) > 0  # the loss counted exactly
    gaps = gap_runs(stored)
    assert {lsn for lo, hi in gaps for lsn in range(lo, hi + 1)} == missing  # and named exactly
    reopened = EpochLog(tmp_path / "log", segment_bytes=8192, max_bytes=32768, full_policy="drop_oldest")
    await reopened.open()
    try:
        assert reopened.stats()["dropped_records"] == dropped  # the counts survive a restart
        assert reopened.gaps == []
    finally:
        await reopened.close()


@contextlib.asynccontextmanager
async def through_a_fault_proxy(tmp_path) -> AsyncIterator[tuple[FaultProxy, str, EpochLog, Any]]:
    """A real cloudd behind a fault proxy, and a log to send from: (proxy, its URL, log, cloudd).
    Once all is stopped, the cloud must hold the log's ten records, each once."""
    cloud = make_cloudd(tmp_path / "cloud")
    await asyncio.to_thread(cloud.start)
    proxy = FaultProxy(cloud.port)
    port = await proxy.start()
    log = EpochLog(tmp_path / "log")
    await log.open()
    try:
        yield proxy, f"http://127.0.0.1:{port}", log, cloud
    finally:
        await log.close()
        await proxy.stop()
        await asyncio.to_thread(cloud.stop)
    assert sorted(r.lsn for r in cloud.records("gw1")) == list(range(1, 11))


async def append_ten(log: EpochLog, uplink: Uplink) -> None:
    for lsn in range(1, 11):
        await log.append(record(lsn))
    await log.flush(wait=True)
    uplink.wake()


async def test_a_request_stuck_in_a_black_hole_is_abandoned_when_the_link_returns(tmp_path):
    """A POST made while the link was down waits on a connection the black hole keeps open; when
    the monitor sees the link come back, the uplink abandons it and sends again at once, rather
    than after its 60 s timeout."""
    async with through_a_fault_proxy(tmp_path) as (proxy, url, log, cloud):
        uplink = Uplink(log, "gw1", config(url, cloud.token_for("gw1"), timeout_s=60.0))
        await uplink.start()
        try:
            await proxy.set_mode("blackhole")
            uplink.link_changed(False)
            await append_ten(log, uplink)
            await eventually(lambda: uplink.counters["attempts"] >= 1, 20, "a POST into the black hole")
            await proxy.set_mode("pass")
            uplink.link_changed(True)
            await eventually(lambda: log.trimmed_lsn == 10, 30, "the records sent again and trimmed")
            assert uplink.counters["abandoned_on_link_return"] == 1
            assert uplink.failures["timeout"] == 0  # nothing waited out its timeout
        finally:
            await uplink.stop()


async def test_a_black_hole_opened_under_a_request_is_seen_from_its_stall(tmp_path):
    """The link is up and probed every 5 s; a black hole opens under the uplink's POST (60 s
    timeout). The POST outlasting its ``stall_after_s`` is a failure; the prober's confirming probe
    fails too: the link is down without waiting for either timeout. When the black hole closes the
    prober sees the link return and the stuck POST is abandoned and sent again."""
    async with through_a_fault_proxy(tmp_path) as (proxy, url, log, cloud):
        monitor = LinkMonitor(down_after_failures=2)
        uplink = Uplink(log, "gw1", config(url, cloud.token_for("gw1"), timeout_s=60.0), monitor=monitor)
        monitor.add_listener(uplink.link_changed)
        prober = LinkProber(monitor, url + "/healthz", interval_s=5.0, timeout_s=2.0, goodput_url=None)
        states: list[str] = []
        monitor.add_listener(lambda up: states.append("up" if up else "down"))
        await uplink.start()
        await prober.start()
        try:
            await eventually(lambda: monitor.snapshot().rtt_s is not None, 10, "a first probe")
            await proxy.set_mode("blackhole")
            await append_ten(log, uplink)
            await eventually(lambda: states == ["down"], 30, "the link called down")
            assert uplink.counters["stalls"] == 1 and uplink.failures["timeout"] == 0  # the POST waits
            await proxy.set_mode("pass")
            await eventually(lambda: log.trimmed_lsn == 10, 30, "the records sent again and trimmed")
            assert states == ["down", "up"]
            assert uplink.counters["abandoned_on_link_return"] == 1
            assert uplink.failures["timeout"] == 0  # nothing waited out its timeout
        finally:
            await prober.stop()
            await uplink.stop()


async def test_a_request_sent_after_the_returning_probe_is_not_abandoned(tmp_path):
    """The monitor holds the link down; the uplink sends on a slow link (0.4 s each way) anyway;
    while its request is on the way a probe sent 3 s earlier, before the request, answers and brings
    the link back. The request went out after that probe, on a link the probe shows working: it is
    kept, not abandoned and sent again (on a slow link that would cost a round trip for nothing)."""
    async with through_a_fault_proxy(tmp_path) as (proxy, url, log, cloud):
        monitor = LinkMonitor(down_after_failures=1)
        uplink = Uplink(log, "gw1", config(url, cloud.token_for("gw1"), timeout_s=60.0), monitor=monitor)
        monitor.add_listener(uplink.link_changed)
        monitor.observe_probe(None)
        await proxy.set_mode("slow", delay_s=0.4)
        await uplink.start()
        try:
            await append_ten(log, uplink)
            await eventually(lambda: uplink.counters["attempts"] >= 1, 10, "a POST on the slow link")
            monitor.observe_probe(3.0)
            assert monitor.snapshot().state == "up"
            await eventually(lambda: log.trimmed_lsn == 10, 30, "the records uploaded and trimmed")
            assert uplink.counters["abandoned_on_link_return"] == 0
            assert uplink.counters["attempts"] == 1
        finally:
            await uplink.stop()


async def test_a_request_that_brings_the_link_back_itself_is_not_abandoned(tmp_path):
    """The link monitor holds the link down; the uplink's next request (a blob, then its batch)
    succeeds, and its own answer is what tells the monitor the link is up: that must not abandon
    the request it came from (nor cut the trim that follows)."""
    cloud = make_cloudd(tmp_path / "cloud")
    await asyncio.to_thread(cloud.start)
    spool = BlobSpool(tmp_path / "spool")
    log = EpochLog(tmp_path / "log")
    await log.open()
    monitor = LinkMonitor(down_after_failures=1, min_goodput_bytes=1)
    uplink = Uplink(log, "gw1", config(cloud.url, cloud.token_for("gw1")), monitor=monitor, blob_spool=spool)
    monitor.add_listener(uplink.link_changed)
    monitor.observe_probe(None)  # a failed probe: the link is down
    assert monitor.snapshot().state == "down"
    await uplink.start()
    try:
        for lsn in range(1, 6):
            ref = spool.put(f"frame {lsn}".encode() * 500)
            await log.append(blob_record("cam1", float(lsn), ref, seq=lsn))
        await log.flush(wait=True)
        uplink.wake()
        await eventually(lambda: log.trimmed_lsn == 5, 20, "the records and their blobs uploaded and trimmed")
        assert monitor.snapshot().state == "up"  # the uplink's own answers brought it back
        assert uplink.counters["abandoned_on_link_return"] == 0 and sum(uplink.failures.values()) == 0
    finally:
        await uplink.stop()
        await log.close()
        await asyncio.to_thread(cloud.stop)


async def test_a_producer_waiting_for_room_does_not_hold_the_uplink(tmp_path):
    """Policy "hold" and a full log: a before-batch hook's append waits for room, which only the
    uplink's own trim can free. The uplink gives the hook up after ``PRODUCER_WAIT_S``, sends and
    trims; the hook's next try appends, and that record goes up too."""
    cloud = make_cloudd(tmp_path / "cloud")
    await asyncio.to_thread(cloud.start)
    log = EpochLog(tmp_path / "log", segment_bytes=4096, max_bytes=8192, full_policy="hold")
    await log.open()
    held: list[int] = []
    try:
        with pytest.raises(TimeoutError):  # fill the log: the append that would wait is cancelled
            for lsn in itertools.count(1):
                async with asyncio.timeout(0.5):
                    await log.append(record(lsn))
        await log.flush(wait=True)
        full_at = log.durable_lsn

        async def producer() -> None:  # holds one record until the uplink takes it
            if not held:
                held.append(await log.append(record(full_at + 1)))
                await log.flush(wait=True)

        uplink = Uplink(log, "gw1", config(cloud.url, cloud.token_for("gw1")))
        uplink.add_before_batch(producer)
        await uplink.start()
        try:
            await eventually(lambda: held and log.trimmed_lsn >= held[0], 30, "the held record sent")
            assert uplink.counters["before_batch_timeouts"] >= 1
        finally:
            await uplink.stop()
    finally:
        await log.close()
        await asyncio.to_thread(cloud.stop)
    assert sorted(r.lsn for r in cloud.records("gw1")) == list(range(1, full_at + 2))
