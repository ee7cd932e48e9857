"""Many rows of one INSERT as one PostgreSQL statement (cloud/store/postgres_bulk.py): the rewrite
itself, and on a real PostgreSQL the tables end as one INSERT per row leaves them."""

from __future__ import annotations

import math

from cloud.store import meta
from cloud.store.migrations import migrate
from cloud.store.postgres_bulk import bulk_insert

TYPES = {"gateway": "text", "device": "text", "records": "bigint", "last_ts": "double precision"}
UPSERT = (
    "INSERT INTO devices (gateway, device, records, last_ts) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (gateway, device) DO UPDATE SET records=devices.records+excluded.records, "
    "last_ts=greatest(devices.last_ts, excluded.last_ts)"
)


def _types(table: str) -> dict[str, str]:
    return TYPES


def test_rows_become_one_array_per_column_under_the_same_conflict_clause():
    statement, literals = bulk_insert(UPSERT, [("g", 'a "b"\\', 1, 5), ("g", "c,{d}", 2, None)], _types)
    assert statement == (
        "INSERT INTO devices (gateway, device, records, last_ts) "
        "SELECT * FROM unnest(?::text[], ?::text[], ?::bigint[], ?::double precision[]) "
        "ON CONFLICT (gateway, device) DO UPDATE SET records=devices.records+excluded.records, "
        "last_ts=greatest(devices.last_ts, excluded.last_ts)"
    )
    assert literals == ['{"g","g"}', '{"a \\"b\\"\\\\","c,{d}"}', "{1,2}", "{5,NULL}"]


def test_without_a_column_list_the_table_gives_the_columns():
    statement, _ = bulk_insert("INSERT INTO devices VALUES (?, ?, ?, ?)", [("g", "a", 1, None)], _types)
    assert statement.startswith("INSERT INTO devices (gateway, device, records, last_ts) SELECT")


def test_what_only_one_statement_per_row_does_is_left_to_executemany():
    # DO UPDATE may not touch a row twice in one statement: a repeated key keeps executemany.
    assert bulk_insert(UPSERT, [("g", "a", 1, 5.0), ("g", "a", 2, 6.0)], _types) is None
    assert bulk_insert(UPSERT, [("g", "a", 1.0, 5.0)], _types) is None  # the server would round it
    assert bulk_insert(UPSERT, [("g", "a", True, 5.0)], _types) is None
    assert bulk_insert(UPSERT, [("g", 7, 1, 5.0)], _types) is None
    assert bulk_insert(UPSERT, [("g", None, 1, 5.0), ("g", "b", 1, 5.0)], _types) is None
    assert bulk_insert(UPSERT, [("g", "a\0", 1, 5.0), ("g", "b", 1, 5.0)], _types) is None
    assert bulk_insert("DELETE FROM devices WHERE gateway=?", [("g",)], _types) is None
    assert bulk_insert("INSERT INTO devices (gateway, nope) VALUES (?, ?)", [("g", 1)], _types) is None
    assert bulk_insert("INSERT INTO devices VALUES (?, ?)", [("g", "a")], _types) is None  # 2 of 4 columns


SAMPLES = "INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
ROLLUPS = (
    "INSERT INTO rollups VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (gateway, device, width, name, bucket) DO UPDATE SET n=rollups.n+excluded.n, "
    "total=rollups.total+excluded.total, lo=least(rollups.lo, excluded.lo), "
    "hi=greatest(rollups.hi, excluded.hi)"
)
ODD_TEXT = ['a "quoted" \\ one', "NULL", "", " padded ", "{braces},commas", "ünï—código", '{"k": [1, 2]}']
ODD_FLOATS = [0.1, -0.0, 1e300, 5e-324, 2.0**53 + 1, math.inf, -math.inf, 3]


def test_on_postgresql_the_tables_end_as_one_insert_per_row_leaves_them(postgres_cluster, postgresql_url):
    from cloud.store.postgres import PostgresDatabase

    samples = [  # keys repeat (DO NOTHING keeps the first)
        ("g", ODD_TEXT[i % 7], ODD_FLOATS[i % 8], 2**62 + i % 3, ODD_TEXT[i % 5], ODD_TEXT[i % 4])
        for i in range(60)
    ]
    rollups = [("g", ODD_TEXT[i], 1, "t", i, 2, ODD_FLOATS[i], i, 2.5 * i) for i in range(7)]
    bulk = PostgresDatabase(postgresql_url, pool_size=1)
    per_row = PostgresDatabase(
        postgres_cluster.create_database("per_row_of_" + postgresql_url.rsplit("/", 1)[1])
    )

    def tables(c):
        return (
            c.execute("SELECT * FROM samples ORDER BY device, ts, seq").fetchall(),
            c.execute("SELECT * FROM rollups ORDER BY device").fetchall(),
        )

    try:
        for db in (bulk, per_row):
            migrate(db, meta.COMPONENT, meta.MIGRATIONS)
        for _ in range(2):  # the second time every sample conflicts and every rollup merges
            bulk.write(lambda c: (c.executemany(SAMPLES, samples), c.executemany(ROLLUPS, rollups)))
            for sample in samples:  # one row: executemany's own path
                per_row.write(lambda c, s=sample: c.executemany(SAMPLES, [s]))
            for rollup in rollups:
                per_row.write(lambda c, r=rollup: c.executemany(ROLLUPS, [r]))
        assert bulk.read(tables) == per_row.read(tables)
        assert len(bulk.read(tables)[0]) == len(set((s[1], s[2], s[3]) for s in samples))
    finally:
        bulk.close()
        per_row.close()
