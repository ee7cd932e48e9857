"""JobTable: every job cloudd was given, in the metadata database (cloud/store/database.py): its
own SQLite file ``<data_dir>/jobs/jobs.sqlite`` by default, or the replicas' PostgreSQL database.

A job moves ``queued -> running -> succeeded | failed | cancelled`` (or ``queued -> cancelled``,
``queued -> failed`` when admission refuses it, ``running -> preempted -> running`` when the scheduler
preempts and later resumes it);
a running job that cloudd was stopped under goes back to ``queued`` and resumes from its last
complete checkpoint when cloudd starts again.

Invariant: a row's state only moves forward along those arrows (``set_state`` refuses any other
move), and each change is committed before the manager acts on it, so a restarted cloudd shows
the same history. With replicas, only the one holding the ``jobs`` role (cloud/roles.py) opens
the table, so one process moves states; ``insert`` also takes the table's lock for ``seq``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from cloud.store.database import Conn, Database, SqliteDatabase
from cloud.store.migrations import Migration, migrate

JobState = Literal["queued", "running", "preempted", "succeeded", "failed", "cancelled"]
WAITING: frozenset[JobState] = frozenset({"queued", "preempted"})
FINAL: frozenset[JobState] = frozenset({"succeeded", "failed", "cancelled"})
_MOVES: set[tuple[JobState, JobState]] = {
    ("queued", "running"),
    ("queued", "cancelled"),
    ("queued", "failed"),  # refused by the scheduler's admission
    ("running", "succeeded"),
    ("running", "failed"),
    ("running", "cancelled"),
    ("running", "queued"),
    ("running", "preempted"),
    ("preempted", "running"),
    ("preempted", "cancelled"),
}

_COLUMNS = (
    "id, seq, spec, state, created_ts, started_ts, finished_ts, exit_code, error, model, lineage, "
    "attained_service_s, steps_done, throughput, preemptions"
)
_JSON_COLUMNS = ("model", "lineage", "throughput")
MIGRATIONS = (
    Migration(
        1,
        "jobs",
        """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    created_ts {real} NOT NULL,
    started_ts {real},
    finished_ts {real},
    exit_code INTEGER,
    error TEXT,
    model TEXT,
    lineage TEXT
)""",
    ),
    Migration(
        2,
        "jobs: the scheduler's figures (a table of an older cloudd gains them, zero-valued)",
        """
ALTER TABLE jobs ADD COLUMN attained_service_s {real} NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN steps_done INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN throughput TEXT NOT NULL DEFAULT '{{}}';
ALTER TABLE jobs ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0""",
    ),
)


@dataclass(frozen=True)
class JobRow:
    id: str
    seq: int
    spec: dict[str, Any]
    state: JobState
    created_ts: float
    started_ts: float | None
    finished_ts: float | None
    exit_code: int | None
    error: str | None
    model: dict[str, Any] | None  # the registry entry the job produced
    lineage: dict[str, Any] | None
    attained_service_s: float = 0.0  # device-seconds of its finished runs
    steps_done: int = 0  # the step its last run reached
    throughput: dict[str, float] = field(default_factory=dict)  # node generation -> steps/s
    preemptions: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class JobTable:
    """Each call is one short transaction (called from the event loop's thread)."""

    def __init__(self, path: Path, database: Database | None = None) -> None:
        """The table in ``database`` (shared by replicas), or else in its own SQLite file at ``path``."""
        if database is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            database = SqliteDatabase(path)
            self._owned: Database | None = database
        else:
            self._owned = None  # the store's: closed by the store
        self._db = database
        migrate(database, "jobs", MIGRATIONS)

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()

    def _row(self, values: tuple[Any, ...]) -> JobRow:
        (id_, seq, spec, state, created, started, finished, code, error, model, lineage) = values[:11]
        attained, steps, throughput, preemptions = values[11:]
        return JobRow(
            id_,
            seq,
            json.loads(spec),
            state,
            created,
            started,
            finished,
            code,
            error,
            json.loads(model) if model else None,
            json.loads(lineage) if lineage else None,
            attained,
            steps,
            json.loads(throughput),
            preemptions,
        )

    def insert(self, spec: dict[str, Any], now: float | None = None) -> JobRow:
        def add(conn: Conn) -> str:
            seq = 1 + (conn.execute("SELECT MAX(seq) FROM jobs").fetchone()[0] or 0)
            job_id = f"job-{seq:05d}"
            conn.execute(
                "INSERT INTO jobs (id, seq, spec, state, created_ts) VALUES (?, ?, ?, ?, ?)",
                (job_id, seq, json.dumps(spec), "queued", now or time.time()),
            )
            return job_id

        return self._existing(self._db.write(add, lock="jobs"))

    def get(self, job_id: str) -> JobRow | None:
        values = self._db.read(
            lambda conn: conn.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        )
        return self._row(values) if values else None

    def _existing(self, job_id: str) -> JobRow:
        """The row of a job that must be there (KeyError otherwise)."""
        row = self.get(job_id)
        if row is None:
            raise KeyError(job_id)
        return row

    def all(self, state: JobState | None = None) -> list[JobRow]:
        query = f"SELECT {_COLUMNS} FROM jobs"
        args: tuple[str, ...] = ()
        if state is not None:
            query, args = query + " WHERE state = ?", (state,)
        rows = self._db.read(lambda conn: conn.execute(query + " ORDER BY seq", args).fetchall())
        return [self._row(v) for v in rows]

    def set_state(self, job_id: str, state: JobState, **fields: Any) -> JobRow:
        """Move a job (only along the allowed arrows) and set ``fields`` in the same transaction."""
        row = self._existing(job_id)
        if (row.state, state) not in _MOVES:
            raise ValueError(f"{job_id}: cannot move from {row.state} to {state}")
        self._update(job_id, {"state": state, **fields})
        return self._existing(job_id)

    def set_fields(self, job_id: str, **fields: Any) -> None:
        """Fields that do not change the state (the model a job registered, its lineage)."""
        self._update(job_id, fields)

    def _update(self, job_id: str, fields: dict[str, Any]) -> None:
        columns = {k: json.dumps(v) if k in _JSON_COLUMNS else v for k, v in fields.items()}
        assignments = ", ".join(f"{name} = ?" for name in columns)
        self._db.write(
            lambda conn: conn.execute(
                f"UPDATE jobs SET {assignments} WHERE id = ?", (*columns.values(), job_id)
            )
        )
