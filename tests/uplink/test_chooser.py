"""BatchChooser on a real log: while the backlog and the live tail both wait, one batch carries
backlog records of one class, then live records, in LSN order; whose go in first alternates; the
acknowledgement books each part where it came from."""

from __future__ import annotations

from pathlib import Path

from gateway.storage.epoch_log import EpochLog
from gateway.uplink.chooser import Batch, BatchChooser, Limits
from tests.uplink.test_uplink_drain import filled_log, record

ORDER = {"alert": "oldest", "summary": "oldest", "raw": "oldest"}


async def scanned(chooser: BatchChooser, durable: int):
    """The next batch that is not a scan slice."""
    batch = await chooser.next_batch(durable)
    while batch is not None and batch.source == "scan":
        batch = await chooser.next_batch(durable)
    return batch


async def test_a_batch_carries_a_backlog_class_and_the_live_tail(tmp_path: Path) -> None:
    log = await filled_log(tmp_path / "log", 30)  # every 10th an alert, every 3rd a summary
    # a backlog above the threshold: it alternates with the live tail (a smaller one holds it back)
    chooser = BatchChooser(log, Limits(records=12, size=1 << 20), ORDER, backlog_threshold=20)
    chooser.start_at(0)
    chooser.failed(Batch("live", []))  # the link failed: the 30 records are backlog
    try:
        assert (await chooser.next_batch(log.durable_lsn)).source == "scan"  # absorbed, classified
        for lsn in range(31, 36):  # then 5 live records
            await log.append(record(lsn))
        await log.flush(wait=True)
        first = await scanned(chooser, log.durable_lsn)  # the live turn: the live tail goes first
        assert first is not None and first.source == "alert"
        lsns = [lsn for lsn, _ in first.entries]
        assert lsns == [10, 20, 30, 31, 32, 33, 34, 35] and first.live == 5  # in LSN order
        assert first.backlog_lsns == [10, 20, 30]
        chooser.acknowledged(first)
        assert chooser.uploaded_by_class["alert"] == 3
        assert chooser.counters["backlog_batches"] == chooser.counters["live_batches"] == 1
        for lsn in range(36, 46):
            await log.append(record(lsn))
        await log.flush(wait=True)
        second = await scanned(chooser, log.durable_lsn)  # the backlog's turn: it goes first
        assert second is not None and second.source == "summary"
        assert second.backlog_lsns == [3, 6, 9, 12, 15, 18, 21, 24, 27]
        assert second.live == 3 and [lsn for lsn, _ in second.entries][-3:] == [36, 37, 38]  # the room left
        chooser.acknowledged(second)
        assert chooser.acked.contains(38) and not chooser.acked.contains(39) and not chooser.acked.contains(1)
    finally:
        await log.close()


def after_a_failure(log: EpochLog, batch_records: int) -> BatchChooser:
    """A chooser whose first batch failed: the log's 30 records are a backlog under its threshold."""
    chooser = BatchChooser(log, Limits(records=batch_records, size=1 << 20), ORDER, backlog_threshold=1000)
    chooser.start_at(0)
    chooser.failed(Batch("live", []))
    return chooser


async def test_a_small_backlog_drains_as_one_generation_before_the_live_tail(tmp_path: Path) -> None:
    log = await filled_log(tmp_path / "log", 30)
    chooser = after_a_failure(log, 12)
    try:
        assert (await chooser.next_batch(log.durable_lsn)).source == "scan"  # absorbed, classified
        for lsn in range(31, 36):  # written while the backlog drains: the next generation
            await log.append(record(lsn))
        await log.flush(wait=True)
        sent: list[int] = []
        while (batch := await scanned(chooser, log.durable_lsn)) is not None and batch.live == 0:
            assert all(lsn <= 30 for lsn, _ in batch.entries), "the live tail waits for the backlog"
            sent += batch.backlog_lsns
            chooser.acknowledged(batch)
        assert sorted(sent) == list(range(1, 31))
        assert batch is not None and [lsn for lsn, _ in batch.entries] == list(range(31, 36))
        assert chooser.counters["live_held_batches"] > 0
    finally:
        await log.close()


async def test_batches_in_flight_hold_distinct_records_and_a_failed_one_comes_back(tmp_path: Path) -> None:
    log = await filled_log(tmp_path / "log", 30)
    chooser = after_a_failure(log, 4)
    try:
        first = await scanned(chooser, log.durable_lsn)
        assert first is not None and first.source == "alert"
        second = await chooser.next_batch(log.durable_lsn, in_flight=True)
        assert second is not None and second.source == "summary" and second.backlog_lsns == [3, 6, 9, 12]
        third = await chooser.next_batch(log.durable_lsn, in_flight=True)
        assert third is not None and third.backlog_lsns == [15, 18, 21, 24]  # not the second's
        assert chooser.status()["backlog_in_flight"] == 11
        chooser.acknowledged(third)  # out of order: the second is still in flight
        chooser.failed(second)  # back in the backlog, chosen again
        chooser.acknowledged(first)
        again = await scanned(chooser, log.durable_lsn)
        assert again is not None and again.backlog_lsns == [3, 6, 9, 12]
        assert chooser.status()["backlog_in_flight"] == 4 and chooser.acked.contains(24)
        await log.append(record(31))  # a live record waits: nothing joins a batch in flight
        await log.flush(wait=True)
        chooser.acknowledged(again)
        assert chooser.uploaded_by_class["summary"] == 8
    finally:
        await log.close()
