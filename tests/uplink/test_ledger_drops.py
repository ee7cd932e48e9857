"""The uplink's books through drops under ``full_policy = "drop_oldest"``, on a real log: a batch on
its way when the log drops its records is lost only if it then fails, and counted once, however the
books and the failure interleave (seen: a drop followed while a batch was in flight booked its
records as trimmed, its failure then counted nothing, and 3 LSNs were neither stored nor counted)."""

from __future__ import annotations

from pathlib import Path

from gateway.storage.epoch_log import EpochLog
from gateway.uplink.chooser import Batch, BatchChooser, Limits
from gateway.uplink.ledger import UplinkLedger
from gateway.uplink.outcome import Outcome
from protocol.batch import BatchAck
from tests.uplink.test_uplink_drain import record

ORDER = {"alert": "oldest", "summary": "oldest", "raw": "oldest"}


async def books_with_a_batch_in_flight(tmp_path: Path) -> tuple[EpochLog, UplinkLedger, Batch]:
    """A small drop_oldest log, its first records chosen and on their way, then written over until
    the log dropped them; (log, ledger, the batch)."""
    log = EpochLog(tmp_path / "log", segment_bytes=4096, max_bytes=16384, full_policy="drop_oldest")
    await log.open()
    ledger = UplinkLedger(log, "gw1", BatchChooser(log, Limits(records=5, size=1 << 20), ORDER, 1000))
    for lsn in range(1, 6):
        await log.append(record(lsn))
    await log.flush(wait=True)
    batch = await ledger.next_batch()
    assert batch is not None and [lsn for lsn, _ in batch.entries] == [1, 2, 3, 4, 5]
    ledger.sending(batch)
    lsn = 5
    while log.trimmed_lsn < 5:  # the log drops the segment the batch's records are in
        lsn += 1
        await log.append(record(lsn))
        await log.flush(wait=True)
    return log, ledger, batch


async def test_a_batch_that_fails_after_the_books_followed_its_drop_is_counted_lost(tmp_path: Path):
    log, ledger, batch = await books_with_a_batch_in_flight(tmp_path)
    try:
        dropped = log.stats()["dropped_records"]
        trimmed = log.trimmed_lsn
        assert dropped == trimmed - 5  # the drop left the batch's records to the batch's fate
        await ledger.next_batch()  # the books follow the drop while the batch is still in flight
        ledger.not_sending(batch)
        await ledger.failed(batch)
        assert log.stats()["dropped_records"] == trimmed  # every dropped LSN counted, once
        named = sorted(lsn for lo, hi in log.gaps for lsn in range(lo, hi + 1))
        assert named == list(range(1, trimmed + 1))  # and each named for a LogGap record
    finally:
        await log.close()


async def test_a_batch_stored_after_its_drop_is_not_counted_lost(tmp_path: Path):
    log, ledger, batch = await books_with_a_batch_in_flight(tmp_path)
    try:
        trimmed = log.trimmed_lsn
        await ledger.next_batch()
        ack = BatchAck(stored=5, duplicates=0, first_lsn=1, last_lsn=5)
        assert ledger.answered(batch, Outcome("ok", ack=ack)).kind == "ok"
        ledger.not_sending(batch)
        assert log.stats()["dropped_records"] == trimmed - 5  # the cloud has those five
    finally:
        await log.close()
