"""The metadata database behind cloud/store/database.py, on both backends (SQLite and a real
PostgreSQL of the test's own): migrations and their version table, refusing an unknown schema,
bringing a SQLite file from before the table under it, per-key write locks and role leases."""

from __future__ import annotations

import threading

import pytest

from cloud.store import DatasetStore, meta
from cloud.store.database import DatabaseError, SqliteDatabase, open_database
from cloud.store.migrations import migrate, version
from tests.cloud.test_cloud_store import batch


def test_migrations_recorded_once_and_reopen_is_a_no_op(tmp_path, database_url):
    for _ in range(2):
        DatasetStore.open(tmp_path / "data", database=database_url).close()
    db = open_database(database_url, tmp_path / "data", readonly=True)
    rows = db.read(lambda c: c.execute("SELECT component, version FROM schema_version").fetchall())
    assert sorted(rows) == [("store", 1), ("store", 2)]
    assert version(db, "store") == len(meta.MIGRATIONS)


def test_a_newer_schema_is_refused_untouched(tmp_path, database_url):
    store = DatasetStore.open(tmp_path / "data", database=database_url)
    store.store_batch(batch([1, 2]))
    store.db.write(
        lambda c: c.execute(
            "INSERT INTO schema_version (component, version, applied_ts, what) VALUES (?, ?, ?, ?)",
            ("store", 99, 0.0, "from a newer cloudd"),
        )
    )
    store.close()
    with pytest.raises(DatabaseError, match="store schema version 99, this cloudd knows 2"):
        DatasetStore.open(tmp_path / "data", database=database_url)
    reader = DatasetStore.open(tmp_path / "data", readonly=True)
    assert reader.counts().records == 2


def test_a_sqlite_file_from_before_the_version_table_is_adopted(tmp_path):
    store = DatasetStore.open(tmp_path / "data")
    store.store_batch(batch([1, 2, 3]))
    store.db.write(lambda c: c.execute("DROP TABLE schema_version"))  # as cloudd left it before
    store.close()
    store = DatasetStore.open(tmp_path / "data")
    assert version(store.db, "store") == len(meta.MIGRATIONS)
    assert [r.lsn for r in store.iter_records()] == [1, 2, 3]
    store.close()


def test_writes_holding_one_key_never_overlap(tmp_path, database_url):
    """Two connections' transactions on one key run one after the other (a read-modify-write
    with no constraint to save it would lose updates otherwise)."""
    if database_url is None:
        db = SqliteDatabase(tmp_path / "meta.sqlite")
    else:
        from cloud.store.postgres import PostgresDatabase

        db = PostgresDatabase(database_url, pool_size=4)
    migrate(db, meta.COMPONENT, meta.MIGRATIONS)
    db.write(lambda c: c.execute("INSERT INTO gateways (id, records) VALUES ('gw1', 0)"))

    def bump(conn) -> None:
        (n,) = conn.execute("SELECT records FROM gateways WHERE id='gw1'").fetchone()
        conn.execute("UPDATE gateways SET records=? WHERE id='gw1'", (n + 1,))

    threads = [
        threading.Thread(target=lambda: [db.write(bump, lock=meta.gateway_lock("gw1")) for _ in range(25)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert db.read(lambda c: c.execute("SELECT records FROM gateways").fetchone()) == (100,)
    db.close()


def test_a_role_lease_has_one_holder_and_passes_on(postgresql_url):
    from cloud.store.postgres import PostgresDatabase

    a, b = PostgresDatabase(postgresql_url, pool_size=1), PostgresDatabase(postgresql_url, pool_size=1)
    lease = a.try_lease("jobs")
    assert lease is not None and lease.alive()
    assert b.try_lease("jobs") is None
    other = b.try_lease("tasks")
    assert other is not None  # another role, another lock
    other.close()
    lease.close()  # as the holder's death would
    assert not lease.alive()
    assert b.try_lease("jobs") is not None
    a.close()
    b.close()
