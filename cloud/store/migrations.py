"""Schema migrations and the ``schema_version`` table, for either backend.

A component (``store``: cloud/store's tables; ``jobs``: cloud/jobs/table.py's) is a list of
``Migration``s numbered from 1. ``migrate`` applies those a database lacks, each in the
transaction that records it in ``schema_version (component, version, applied_ts, what)``, under the
component's lock, so replicas starting together apply each migration once. The DDL is written
once with ``{real}``, ``{int8}``, ``{norowid}``, ``{serial_pk}`` for the column types that differ
(``Dialect.ddl``); every statement is ``IF NOT EXISTS``, so a SQLite file from before this table
(``PRAGMA user_version`` 1 or 2) is brought under it by running them again.

Invariant: after ``migrate`` returns, the database has every migration of the component, each
recorded once; a database recorded at a version this cloudd does not know is refused, untouched.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from cloud.store.database import Conn, Database, DatabaseError


@dataclass(frozen=True)
class Migration:
    version: int
    what: str
    ddl: str


_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS schema_version (
    component TEXT NOT NULL, version INTEGER NOT NULL, applied_ts {real} NOT NULL, what TEXT NOT NULL,
    PRIMARY KEY (component, version))"""


def migrate(db: Database, component: str, migrations: Sequence[Migration]) -> int:
    """Apply what ``db`` lacks of ``component``; return its version now."""
    known = [m.version for m in migrations]
    assert known == list(range(1, len(known) + 1)), f"{component}: migrations must number 1..n, got {known}"

    def apply(conn: Conn) -> int:
        for statement in conn.dialect.ddl(_VERSION_TABLE):
            conn.execute(statement)
        (current,) = conn.execute(
            "SELECT coalesce(max(version), 0) FROM schema_version WHERE component=?", (component,)
        ).fetchone()
        if current > len(migrations):
            raise DatabaseError(
                f"{db.description}: {component} schema version {current}, this cloudd knows {len(migrations)}"
            )
        for m in migrations[current:]:
            for statement in conn.dialect.ddl(m.ddl):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_version (component, version, applied_ts, what) VALUES (?, ?, ?, ?)",
                (component, m.version, time.time(), m.what),
            )
        return len(migrations)

    return db.write(apply, lock=f"migrate:{component}")


def version(db: Database, component: str) -> int:
    """The component's recorded version (0: never migrated)."""

    def query(conn: Conn) -> int:
        (current,) = conn.execute(
            "SELECT coalesce(max(version), 0) FROM schema_version WHERE component=?", (component,)
        ).fetchone()
        return int(current)

    return db.read(query)
