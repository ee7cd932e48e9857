"""cloudd's TaskRunner in process, over a real DatasetStore and BlobStore in a temporary data
directory, for what cloudd's command line does not reach: a small per-log buffer, the clock a
waiting frame is measured by, a store that refuses writes. Each pass is run by the test (as an
upload's wake-up would run it), so the order of uploads and passes is the test's."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import models
from cloud.store.blobs import BlobStore
from cloud.store.writer import AsyncStoreWriter
from cloud.tasks.camera import FrameInference, Made
from cloud.tasks.cursor import CURSOR_FILE
from cloud.tasks.runner import TaskRunner, TaskRunnerConfig
from protocol.batch import BatchEntry, UploadBatch
from protocol.derived import FrameForCloud, derived_log_id
from protocol.records import Record
from tests.cloud.test_cloud_tasks import (
    CLOUD,
    GW,
    LOG,
    expected_windows,
    frame_record,
    jpeg_of,
    marker,
    numbered,
    sensor_stream,
    windows_of,
)

FACTORY = Path(models.__file__).resolve().parent / "artifacts"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def writer(tmp_path: Path) -> AsyncIterator[AsyncStoreWriter]:
    store = AsyncStoreWriter(tmp_path / "data")
    await store.open()
    yield store
    await store.close()


def runner(writer: AsyncStoreWriter, clock: Clock | None = None, **config: object) -> TaskRunner:
    """A runner on ``writer``'s data directory, as cloudd builds it; ``start`` is not called: the
    test runs each pass itself."""
    made = TaskRunner(
        writer,
        BlobStore(writer.data_dir / "blobs"),
        None,
        data_dir=writer.data_dir,
        factory_dir=FACTORY,
        config=TaskRunnerConfig(**config),  # type: ignore[arg-type]
        **({"clock": clock} if clock is not None else {}),
    )
    made._reset()  # what start() does before its first pass: load the saved cursors
    return made


async def upload(writer: AsyncStoreWriter, entries: list[tuple[int, Record]], log_id: str = LOG) -> None:
    records = [BatchEntry(lsn=lsn, data=r) for lsn, r in sorted(entries, key=lambda e: e[0])]
    await writer.store_batch(UploadBatch(v=1, gateway=GW, log_id=log_id, records=records))


def stored(writer: AsyncStoreWriter, task: str, log_id: str = LOG) -> dict[int, dict]:
    found: dict[int, dict] = {}
    for record in writer.store.iter_records(GW):
        if record.log_id == derived_log_id(log_id, task):
            assert record.lsn not in found, f"{task} stored twice at {record.lsn}"
            found[record.lsn] = record.record["body"]
    return found


# --- a full buffer ----------------------------------------------------------------------------------


def after_an_outage(backlog: list[int], live: list[int], batch: int) -> Iterator[list[int]]:
    """The LSNs of each upload, in the order the uplink sends them after an outage: the backlog's
    alerts first (every seventh record here), then its summaries (every fifth), then the rest of it
    oldest first, with a batch of live records after each upload of the backlog."""
    alerts = backlog[6::7]
    summaries = [lsn for lsn in backlog[4::5] if lsn not in alerts]
    rest = [lsn for lsn in backlog if lsn not in alerts and lsn not in summaries]
    backlog_batches = [alerts, summaries, *(rest[i : i + batch] for i in range(0, len(rest), batch))]
    live_batches = [live[i : i + 2] for i in range(0, len(live), 2)]
    for i, sent in enumerate(backlog_batches):
        yield sent
        if i < len(live_batches):
            yield live_batches[i]
    yield from live_batches[len(backlog_batches) :]


async def test_a_full_buffer_after_an_outage_delays_no_record_for_good(writer):
    log = numbered([marker(CLOUD), *sensor_stream(100.0, 6), marker(CLOUD)])
    lsns = [lsn for lsn, _ in log]
    backlog, live = lsns[: len(lsns) * 2 // 3], lsns[len(lsns) * 2 // 3 :]
    tasks = runner(writer, max_buffered=4, read_chunk=7)
    records = dict(log)
    for sent in after_an_outage(backlog, live, batch=3):
        await upload(writer, [(lsn, records[lsn]) for lsn in sent])
        await tasks.run_pass()  # as the upload's wake-up would
    status = tasks.status()
    assert status["logs"][0]["reading_lsn"] == len(log) + 1
    assert windows_of(stored(writer, "sensor/aggregate")) == expected_windows(log)
    assert status["logs"][0]["left_out"] > 0 and status["rescans"] > 0  # the buffer was too small


async def test_a_full_buffer_keeps_reading_while_a_hole_is_below_what_it_left_out(writer):
    """Left out above a hole; live records buffered above them; then the hole fills."""
    log = numbered([marker(CLOUD), *sensor_stream(200.0, 3, devices=("a",)), marker(CLOUD)])
    records = dict(log)
    tasks = runner(writer, max_buffered=5)
    for sent in ([2, 3, 5, 6, 7, 8], [1], [12], [4], [lsn for lsn, _ in log if lsn > 8 and lsn != 12]):
        await upload(writer, [(lsn, records[lsn]) for lsn in sent])
        await tasks.run_pass()
    assert tasks.status()["logs"][0]["reading_lsn"] == len(log) + 1
    assert windows_of(stored(writer, "sensor/aggregate")) == expected_windows(log)


# --- frames -----------------------------------------------------------------------------------------


async def test_a_frame_whose_blob_never_comes_fails_after_blob_wait_s_across_a_restart(writer):
    clock = Clock()
    log = numbered([marker({"infer": "cloud", "summarise": "cloud"}, service="camera")])
    log.append((2, frame_record(1, "lost1", b"never uploaded")))
    await upload(writer, log)
    await runner(writer, clock, blob_wait_s=60.0).run_pass()
    clock.now += 59.0
    restarted = runner(writer, clock, blob_wait_s=60.0)  # the first sight is in the cursor file
    await restarted.run_pass()
    assert restarted.status()["waiting_blobs"] == 1 and stored(writer, "camera/summarise") == {}
    clock.now += 2.0
    await restarted.run_pass()
    [(lsn, failed)] = stored(writer, "camera/summarise").items()
    assert (lsn, failed["type"], failed["reason"]) == (2, "task_failed", "blob_missing")
    status = restarted.status()
    assert status["waiting_blobs"] == 0 and status["failures"] == {"blob_missing": 1}
    assert status["made"]["camera/summarise"] == 0
    assert b'"waiting":[]' in (writer.data_dir / "tasks" / CURSOR_FILE).read_bytes()


def test_an_unreadable_blob_is_a_failure_of_its_frame(tmp_path):
    blobs = BlobStore(tmp_path / "blobs")
    jpeg = jpeg_of("circle")
    blobs.append(GW, "f1", 0, jpeg, hashlib.sha256(jpeg).hexdigest())
    frame = FrameForCloud.model_validate(frame_record(1, "f1", jpeg).body)
    inference = FrameInference(blobs, None, FACTORY)
    assert isinstance(inference.infer(GW, 2, frame), Made)
    path = blobs.committed_path(GW, "f1")  # committed, then its file turns unreadable
    path.unlink()
    path.mkdir()
    failed = inference.infer(GW, 2, frame)
    assert not isinstance(failed, Made) and failed.reason == "blob_unreadable"  # type: ignore[union-attr]


# --- a busy store, and what is counted --------------------------------------------------------------


async def test_a_store_still_busy_ends_the_pass_before_the_save_and_the_next_pass_makes_it_all(writer):
    log = numbered([marker(CLOUD), *sensor_stream(300.0, 3), marker(CLOUD)])
    await upload(writer, log)
    tasks = runner(writer, store_busy_tries=3, store_busy_backoff_s=(0.01, 0.01))
    writer.max_pending = 0  # every store call is refused, as when uploads fill its queue
    await tasks.run_pass()
    status = tasks.status()
    assert (status["store_busy"], status["store_gave_up"], status["stored"]) == (3, 1, 0)
    assert not (writer.data_dir / "tasks" / CURSOR_FILE).exists()  # nothing saved past unstored results
    writer.max_pending = 64
    await tasks.run_pass()
    aggregates = stored(writer, "sensor/aggregate")
    assert windows_of(aggregates) == expected_windows(log)
    assert tasks.status()["made"]["sensor/aggregate"] == len(aggregates)


async def test_results_made_again_are_not_counted_again(writer):
    log = numbered([marker(CLOUD), *sensor_stream(400.0, 2), marker(CLOUD)])
    await upload(writer, log)
    first = runner(writer)
    await first.run_pass()
    made = first.status()["made"]
    assert made["sensor/aggregate"] == len(stored(writer, "sensor/aggregate")) > 0
    (writer.data_dir / "tasks" / CURSOR_FILE).unlink()  # lost: the next runner makes everything again
    again = runner(writer)
    await again.run_pass()
    status = again.status()
    assert status["made"] == dict.fromkeys(made, 0) and status["stored"] == 0
    assert status["logs"][0]["reading_lsn"] == len(log) + 1
