"""JobTable: every job cloudd was given, in SQLite at ``<data_dir>/jobs/jobs.sqlite``.

A job moves ``queued -> running -> succeeded | failed | cancelled`` (or ``queued -> cancelled``, or
``queued -> failed`` when the scheduler's admission refuses it);
a running job that cloudd was stopped under goes back to ``queued`` and resumes from its last
complete checkpoint when cloudd starts again. A job the scheduler preempts moves ``running ->
preempted`` (it waits in the queue again, its checkpoint on disk) and ``preempted -> running`` when
it resumes (or ``preempted -> cancelled``). Each row keeps what the scheduler needs of a job across
restarts: ``attained_service_s`` (device-seconds held by its finished runs), ``steps_done``,
``throughput`` (steps/s measured per node generation) and ``preemptions``.

Invariant: a row's state only moves forward along those arrows (``set_state`` refuses any other
move), and each change is committed before the manager acts on it, so a restarted cloudd shows
the same history.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

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

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    created_ts REAL NOT NULL,
    started_ts REAL,
    finished_ts REAL,
    exit_code INTEGER,
    error TEXT,
    model TEXT,
    lineage TEXT
)
"""
# Columns added after the first release: a table of an older cloudd gains them, zero-valued.
_ADDED_COLUMNS = {
    "attained_service_s": "REAL NOT NULL DEFAULT 0",
    "steps_done": "INTEGER NOT NULL DEFAULT 0",
    "throughput": "TEXT NOT NULL DEFAULT '{}'",
    "preemptions": "INTEGER NOT NULL DEFAULT 0",
}
_JSON_COLUMNS = ("model", "lineage", "throughput")


# the column order JobTable._row unpacks (an older table gained the added columns at its end too)
_SELECTED = (
    "id, seq, spec, state, created_ts, started_ts, finished_ts, exit_code, error, model, lineage, "
    + ", ".join(_ADDED_COLUMNS)
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
    """One connection, used from the event loop's thread only (each call is a short transaction)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(path, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute(_SCHEMA)
        present = {row[1] for row in self._conn.execute("PRAGMA table_info(jobs)")}
        for name, kind in _ADDED_COLUMNS.items():
            if name not in present:
                self._conn.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")

    def close(self) -> None:
        self._conn.close()

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
        with self._conn:
            seq = 1 + (self._conn.execute("SELECT MAX(seq) FROM jobs").fetchone()[0] or 0)
            job_id = f"job-{seq:05d}"
            self._conn.execute(
                "INSERT INTO jobs (id, seq, spec, state, created_ts) VALUES (?, ?, ?, ?, ?)",
                (job_id, seq, json.dumps(spec), "queued", now or time.time()),
            )
        return self._existing(job_id)

    def get(self, job_id: str) -> JobRow | None:
        values = self._conn.execute(f"SELECT {_SELECTED} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return self._row(values) if values else None

    def _existing(self, job_id: str) -> JobRow:
        """The row of a job that must be there (KeyError otherwise)."""
        row = self.get(job_id)
        if row is None:
            raise KeyError(job_id)
        return row

    def all(self, state: JobState | None = None) -> list[JobRow]:
        query = f"SELECT {_SELECTED} FROM jobs"
        args: tuple[str, ...] = ()
        if state is not None:
            query, args = query + " WHERE state = ?", (state,)
        return [self._row(v) for v in self._conn.execute(query + " ORDER BY seq", args)]

    def set_state(self, job_id: str, state: JobState, **fields: Any) -> JobRow:
        """Move a job (only along the allowed arrows) and set ``fields`` in the same transaction."""
        row = self._existing(job_id)
        if (row.state, state) not in _MOVES:
            raise ValueError(f"{job_id}: cannot move from {row.state} to {state}")
        columns = {
            "state": state,
            **{k: json.dumps(v) if k in _JSON_COLUMNS else v for k, v in fields.items()},
        }
        assignments = ", ".join(f"{name} = ?" for name in columns)
        with self._conn:
            self._conn.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*columns.values(), job_id))
        return self._existing(job_id)

    def set_fields(self, job_id: str, **fields: Any) -> None:
        """Fields that do not change the state (the model a job registered, its lineage)."""
        columns = {k: json.dumps(v) if k in _JSON_COLUMNS else v for k, v in fields.items()}
        with self._conn:
            self._conn.execute(
                f"UPDATE jobs SET {', '.join(f'{n} = ?' for n in columns)} WHERE id = ?",
                (*columns.values(), job_id),
            )
