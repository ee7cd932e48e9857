"""PostgresDatabase: the metadata database on PostgreSQL (psycopg 3 and psycopg_pool), shared by
every cloudd replica of one deployment.

Connections come from a bounded pool (``pool_size``; a caller that finds none free within
``POOL_WAIT_S`` gets ``DatabaseError``); a read-only opener (a job's dataset step, a test's reader)
uses one short connection per call instead. Write transactions take ``pg_advisory_xact_lock`` on
their key first, so they serialise with every replica's transactions on that key and release it
at commit, rollback or when the process dies (the server ends its session). Leases are session
advisory locks on a connection of their own, held until ``close`` or the process's death. An
``executemany`` of an INSERT sends its rows as one statement of column arrays (postgres_bulk.py).

Invariant: every psycopg error leaves here as ``DatabaseError`` naming the database (without its
password) and the reason; nothing else of psycopg crosses this module's boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg import conninfo

from cloud.store import postgres_bulk
from cloud.store.database import POSTGRESQL, Conn, Database, DatabaseError, Lease

T = TypeVar("T")
CONNECT_TIMEOUT_S = 5
POOL_WAIT_S = 30.0


def redacted(url: str) -> str:
    """The connection string without its password: what logs and the data directory's marker hold."""
    try:
        params = conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise DatabaseError(f"--database: not a PostgreSQL connection string ({exc})") from None
    params.pop("password", None)
    return conninfo.make_conninfo("", **{k: str(v) for k, v in params.items() if v is not None})


class _AdvisoryLease(Lease):
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn: psycopg.Connection[Any] | None = conn

    def alive(self) -> bool:
        if self._conn is None:
            return False
        try:
            self._conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()  # the session ends: the server releases its advisory locks
            self._conn = None


class _BulkConn(Conn):
    """``executemany`` of an INSERT sends its rows as arrays in one statement (postgres_bulk.py)."""

    def __init__(
        self, raw: Any, lock: Callable[[str], None], column_types: dict[str, dict[str, str]]
    ) -> None:
        super().__init__(raw, POSTGRESQL, lock)
        self._column_types = column_types  # table -> its columns' types, shared by the database's connections

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        bulk = postgres_bulk.bulk_insert(sql, rows, self._types) if len(rows) > 1 else None
        if bulk is None:
            super().executemany(sql, rows)
            return
        statement, literals = bulk
        self.execute(statement, literals)

    def _types(self, table: str) -> dict[str, str]:
        # Read once per table and process: migrations run at cloudd's start, before any batch.
        if table not in self._column_types:
            rows = self.execute(postgres_bulk.COLUMN_TYPES_SQL, (table,)).fetchall()
            self._column_types[table] = dict(rows)
        return self._column_types[table]


class PostgresDatabase(Database):
    dialect = POSTGRESQL
    shared = True

    def __init__(self, url: str, *, pool_size: int = 8, readonly: bool = False) -> None:
        self.url, self.readonly = url, readonly
        self._description = redacted(url)
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._column_types: dict[str, dict[str, str]] = {}
        # Fail here, with one clear line, rather than in the first request: connect once now.
        self._connect().close()
        if pool_size > 0:
            self._pool = psycopg_pool.ConnectionPool(
                url,
                min_size=1,
                max_size=pool_size,
                kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
                timeout=POOL_WAIT_S,
                name="cloudd-metadata",
                open=True,
            )

    @property
    def description(self) -> str:
        return self._description

    def _fail(self, exc: Exception) -> DatabaseError:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return DatabaseError(f"PostgreSQL {self._description}: {reason}")

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise self._fail(exc) from None

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        if self._pool is None:
            conn = self._connect()
            try:
                yield conn
            finally:
                conn.close()
            return
        with self._pool.connection() as conn:
            yield conn

    def _run(self, fn: Callable[[Conn], T], first: str | None) -> T:
        def lock(key: str) -> None:
            raw.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))

        try:
            with self._connection() as raw, raw.transaction():
                if first is not None:
                    raw.execute(first)
                return fn(_BulkConn(raw, lock, self._column_types))
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            # The server or the link went away, or it refused a statement: ours, with the reason.
            raise self._fail(exc) from exc

    def write(self, fn: Callable[[Conn], T], *, lock: str | None = None) -> T:
        if self.readonly:
            raise DatabaseError(f"PostgreSQL {self._description}: opened read-only")

        def locked(conn: Conn) -> T:
            if lock is not None:
                conn.lock(lock)
            return fn(conn)

        return self._run(locked, None)

    def read(self, fn: Callable[[Conn], T]) -> T:
        return self._run(fn, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def try_lease(self, name: str) -> Lease | None:
        conn = self._connect()
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (f"lease:{name}",)).fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise self._fail(exc) from None
        if not row or not row[0]:
            conn.close()
            return None
        return _AdvisoryLease(conn)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
