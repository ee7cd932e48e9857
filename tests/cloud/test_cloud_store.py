"""DatasetStore on real files: idempotency, ordering, recovery of torn segments, reporting corruption.

The ``store`` fixture and the tests that take ``database_url`` run on both metadata backends
(SQLite, and a real PostgreSQL of the test's own: tests/harness/postgres.py)."""

from __future__ import annotations

import pytest

from cloud.store import DatasetStore, StoreLocked, meta
from cloud.store.segments import segment_path
from protocol.batch import decode_batch
from tests.harness.cloud_http import batch_body

LOG = "abcdef12"


def batch(lsns, gateway="gw1", log_id=LOG, device="dev1"):
    return decode_batch(batch_body(gateway, log_id, lsns, device))


def lsns_of(store, gateway=None):
    return sorted((r.gateway, r.log_id, r.lsn) for r in store.iter_records(gateway))


@pytest.fixture
def store(tmp_path, database_url):
    s = DatasetStore.open(tmp_path / "data", database=database_url)
    yield s
    s.close()


def test_batch_stored_and_counted(store):
    ack = store.store_batch(batch([1, 2, 3]))
    assert (ack.stored, ack.duplicates, ack.first_lsn, ack.last_lsn) == (3, 0, 1, 3)
    records = list(store.iter_records())
    assert [r.lsn for r in records] == [1, 2, 3]
    assert records[0].record["device"] == "dev1" and records[0].record["kind"] == "telemetry"
    counts = store.counts()
    assert (counts.records, counts.batches) == (3, 1)
    assert counts.devices[0].records == 3 and counts.devices[0].last_ts == 1003.0
    assert counts.gateways[0].last_seen is not None


def test_replay_stores_nothing_and_is_acknowledged(store):
    store.store_batch(batch([1, 2, 3]))
    ack = store.store_batch(batch([1, 2, 3]))
    assert (ack.stored, ack.duplicates) == (0, 3)
    assert [r.lsn for r in store.iter_records()] == [1, 2, 3]
    counts = store.counts()
    assert (counts.records, counts.batches, counts.gateways[0].duplicates) == (3, 2, 3)


def test_partial_overlap_stores_only_new(store):
    store.store_batch(batch([1, 2, 3, 4]))
    ack = store.store_batch(batch([3, 4, 5, 6]))
    assert (ack.stored, ack.duplicates) == (2, 2)
    assert [r.lsn for r in store.iter_records()] == [1, 2, 3, 4, 5, 6]
    assert store.stored_ranges("gw1", LOG) == [(1, 6)]


def test_out_of_order_batches_and_gaps(store):
    store.store_batch(batch([10, 11, 12]))
    store.store_batch(batch([1, 2]))
    assert store.stored_ranges("gw1", LOG) == [(1, 2), (10, 12)]
    ack = store.store_batch(batch([2, 3, 4, 5, 6, 7, 8, 9, 10]))  # fills the gap, overlaps both sides
    assert (ack.stored, ack.duplicates) == (7, 2)
    assert store.stored_ranges("gw1", LOG) == [(1, 12)]
    assert [lsn for _, _, lsn in lsns_of(store)] == list(range(1, 13))


def test_log_ids_and_gateways_are_separate_namespaces(store):
    store.store_batch(batch([1, 2]))
    assert store.store_batch(batch([1, 2], log_id="0123456789")).stored == 2  # a new log restarts LSNs
    assert store.store_batch(batch([1, 2], gateway="gw2")).stored == 2
    assert len(lsns_of(store)) == 6
    assert len(lsns_of(store, "gw2")) == 2
    assert {(g.id, g.records) for g in store.counts().gateways} == {("gw1", 4), ("gw2", 2)}


def test_segments_roll_over_and_survive_reopen(tmp_path, database_url):
    s = DatasetStore.open(tmp_path / "data", database=database_url, segment_max_bytes=2000)
    for start in range(1, 60, 5):
        s.store_batch(batch(list(range(start, start + 5))))
    s.close()
    s = DatasetStore.open(tmp_path / "data", database=database_url, segment_max_bytes=2000)
    assert len(list((tmp_path / "data" / "datasets" / "gw1").iterdir())) > 1
    assert [r.lsn for r in s.iter_records()] == list(range(1, 61))
    assert s.recovery.cut_bytes == 0 and not s.recovery.corrupt
    s.close()


def test_torn_segment_tail_is_cut_on_open(tmp_path):
    s = DatasetStore.open(tmp_path / "data")
    s.store_batch(batch([1, 2, 3]))
    s.close()
    path = segment_path(tmp_path / "data" / "datasets", "gw1", 1)
    committed = path.stat().st_size
    with open(path, "ab") as f:  # a write that was fsynced but whose metadata never committed, half a line
        f.write(b'{"log_id":"abcdef12","lsn":4,"data":{"v":1,"ki')
    s = DatasetStore.open(tmp_path / "data")
    assert s.recovery.cut_bytes > 0 and not s.recovery.corrupt
    assert path.stat().st_size == committed
    assert [r.lsn for r in s.iter_records()] == [1, 2, 3]
    assert s.store_batch(batch([3, 4])).stored == 1  # the gateway's retry stores LSN 4 exactly once
    assert [r.lsn for r in s.iter_records()] == [1, 2, 3, 4]
    s.close()


def test_crash_between_fsync_and_commit(tmp_path, monkeypatch):
    """The metadata commit fails after the segment bytes are durable: not acknowledged, cut on open."""
    s = DatasetStore.open(tmp_path / "data")
    s.store_batch(batch([1, 2]))

    def commit_fails(conn, change):
        raise OSError("simulated crash before the metadata commit")  # a fault we cannot cause for real

    monkeypatch.setattr(meta, "commit_batch", commit_fails)
    with pytest.raises(OSError):
        s.store_batch(batch([3, 4, 5]))
    monkeypatch.undo()
    path = segment_path(tmp_path / "data" / "datasets", "gw1", 1)
    size_with_uncommitted = path.stat().st_size
    assert [r.lsn for r in s.iter_records()] == [1, 2]  # readers never see uncommitted bytes
    s.close()
    s = DatasetStore.open(tmp_path / "data")
    assert s.recovery.cut_bytes > 0 and path.stat().st_size < size_with_uncommitted
    assert s.store_batch(batch([3, 4, 5])).stored == 3
    assert [r.lsn for r in s.iter_records()] == [1, 2, 3, 4, 5]
    assert s.counts().records == 5
    s.close()


def test_failed_commit_then_next_write_in_same_process(tmp_path, monkeypatch, database_url):
    s = DatasetStore.open(tmp_path / "data", database=database_url)
    monkeypatch.setattr(meta, "commit_batch", lambda conn, change: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(OSError):
        s.store_batch(batch([1, 2]))
    monkeypatch.undo()
    assert s.store_batch(batch([1, 2, 3])).stored == 3  # stale uncommitted bytes are overwritten, not kept
    assert [r.lsn for r in s.iter_records()] == [1, 2, 3]
    s.close()


def test_uncommitted_new_segment_is_removed(tmp_path):
    s = DatasetStore.open(tmp_path / "data")
    s.store_batch(batch([1]))
    s.close()
    orphan = segment_path(tmp_path / "data" / "datasets", "gw1", 2)
    orphan.write_bytes(b'{"log_id":"abcdef12","lsn":2,"data":{}}\n')
    s = DatasetStore.open(tmp_path / "data")
    assert s.recovery.removed_segments == [orphan] and not orphan.exists()
    assert [r.lsn for r in s.iter_records()] == [1]
    s.close()


def test_lost_committed_bytes_are_reported_as_corruption(tmp_path):
    s = DatasetStore.open(tmp_path / "data")
    s.store_batch(batch([1, 2, 3]))
    s.close()
    path = segment_path(tmp_path / "data" / "datasets", "gw1", 1)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 10)
    s = DatasetStore.open(tmp_path / "data")
    assert s.recovery.corrupt and s.recovery.missing_bytes == {path: 10}
    assert [r.lsn for r in s.iter_records()] == [1, 2]  # the damaged last line is counted, not returned
    assert s.corrupt_lines == 1
    s.close()


def test_one_writer_per_data_dir_and_readers_do_not_recover(tmp_path):
    s = DatasetStore.open(tmp_path / "data")
    s.store_batch(batch([1, 2]))
    with pytest.raises(StoreLocked):
        DatasetStore.open(tmp_path / "data")
    path = segment_path(tmp_path / "data" / "datasets", "gw1", 1)
    with open(path, "ab") as f:  # bytes a running writer has not committed yet
        f.write(b"partial")
    reader = DatasetStore.open(tmp_path / "data", readonly=True)
    assert [r.lsn for r in reader.iter_records()] == [1, 2]
    assert path.read_bytes().endswith(b"partial")  # a reader never cuts the writer's tail
    s.close()


def test_shared_store_cuts_an_uncommitted_tail_at_the_next_write_not_at_open(tmp_path, postgresql_url):
    """On PostgreSQL no process owns the data directory: bytes past a committed length may be
    another replica's write in flight, so ``open`` leaves them; the next write to that segment,
    under the gateway's lock, cuts them (they were never acknowledged)."""
    s = DatasetStore.open(tmp_path / "data", database=postgresql_url)
    s.store_batch(batch([1, 2, 3]))
    path = segment_path(tmp_path / "data" / "datasets", "gw1", 1)
    committed = path.stat().st_size
    with open(path, "ab") as f:  # a replica killed between its fsync and its commit
        f.write(b'{"log_id":"abcdef12","lsn":4,"data":{"v":1,"ki')
    other = DatasetStore.open(tmp_path / "data", database=postgresql_url)  # a second replica starting
    assert other.recovery.cut_bytes == 0 and not other.recovery.corrupt
    assert path.stat().st_size > committed
    assert [r.lsn for r in other.iter_records()] == [1, 2, 3]
    assert other.store_batch(batch([3, 4])).stored == 1  # the retry, through the other replica
    assert [r.lsn for r in s.iter_records()] == [1, 2, 3, 4]
    s.close()
    other.close()


def test_two_writers_on_one_postgresql_store_each_record_once(tmp_path, postgresql_url):
    """Two stores (as two replicas) on one database and one data directory, the same batches sent
    to both from threads at once: every LSN is stored exactly once, every ack is true."""
    from concurrent.futures import ThreadPoolExecutor

    a = DatasetStore.open(tmp_path / "data", database=postgresql_url, segment_max_bytes=3000)
    b = DatasetStore.open(tmp_path / "data", database=postgresql_url, segment_max_bytes=3000)
    batches = [batch(list(range(start, start + 7))) for start in range(1, 200, 5)]  # overlapping
    with ThreadPoolExecutor(4) as pool:
        acks = list(pool.map(lambda i: (a, b)[i % 2].store_batch(batches[i // 2]), range(2 * len(batches))))
    lsns = [r.lsn for r in a.iter_records()]
    assert sorted(lsns) == list(range(1, 203)) and len(set(lsns)) == len(lsns)
    assert sum(ack.stored for ack in acks) == 202
    assert a.counts().records == 202 and b.stored_ranges("gw1", LOG) == [(1, 202)]
    a.close()
    b.close()


def test_a_data_dir_is_bound_to_one_database(tmp_path, postgres_cluster, postgresql_url):
    from cloud.store.database import DatabaseError

    DatasetStore.open(tmp_path / "sqlite").close()
    with pytest.raises(DatabaseError, match="holds a SQLite store"):
        DatasetStore.open(tmp_path / "sqlite", database=postgresql_url)
    DatasetStore.open(tmp_path / "pg", database=postgresql_url).close()
    with pytest.raises(DatabaseError, match="metadata is in PostgreSQL"):
        DatasetStore.open(tmp_path / "pg")
    other = postgres_cluster.create_database("other_of_" + postgresql_url.rsplit("/", 1)[1])
    with pytest.raises(DatabaseError, match="holds the store of PostgreSQL"):
        DatasetStore.open(tmp_path / "pg", database=other)
    reader = DatasetStore.open(tmp_path / "pg", readonly=True)  # a reader follows the marker
    assert reader.counts().records == 0
