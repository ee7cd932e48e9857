"""The pure parts of the job manager: progress-line tailing, events, job table moves, windows + lineage."""

from __future__ import annotations

import pytest

from cloud.jobs.datasets import lsn_runs, windows_from_records
from cloud.jobs.events import JobEvents, tail_lines
from cloud.jobs.table import JobTable
from cloud.store.dataset import StoredRecord


def test_tail_lines_keeps_a_partial_line_and_skips_torn_ones():
    records, used = tail_lines(b'{"a": 1}\n{torn\n{"b": 2}\n{"c": ')
    assert records == [{"a": 1}, {"b": 2}] and used == len(b'{"a": 1}\n{torn\n{"b": 2}\n')


def test_events_are_numbered_and_bounded():
    events = JobEvents(max_events=3)
    events.extend(
        [{"event": "start", "total_steps": 9}]
        + [{"event": "step", "step": i, "loss": 1.0 / i} for i in range(1, 5)]
    )
    events.extend([{"event": "done"}])
    assert [e["seq"] for e in events.events] == [0, 1, 2, 3] and events.dropped == 2
    assert events.events[-1]["event"] == "done" and events.summary["step"] == 4
    assert events.since(2) == events.events[2:]


def _job_database(url):
    """None: the table's own SQLite file; else the replicas' PostgreSQL database."""
    if url is None:
        return None
    from cloud.store.postgres import PostgresDatabase

    return PostgresDatabase(url, pool_size=2)


def test_job_table_moves_only_forward(tmp_path, database_url):
    table = JobTable(tmp_path / "jobs.sqlite", _job_database(database_url))
    row = table.insert({"model": "digits_cnn"}, now=1.0)
    assert (row.id, row.state) == ("job-00001", "queued")
    table.set_state(row.id, "running", started_ts=2.0)
    table.set_state(row.id, "succeeded", finished_ts=3.0, model={"name": "digits"})
    with pytest.raises(ValueError):
        table.set_state(row.id, "running")
    table.close()
    again = JobTable(tmp_path / "jobs.sqlite", _job_database(database_url))
    assert again.get("job-00001").model == {"name": "digits"} and again.insert({}).id == "job-00002"


def _reading(gateway: str, lsn: int, device: str = "d1", status: str = "ok", humidity: float | None = 50.0):
    body = {
        "v": 1,
        "device": device,
        "seq": lsn,
        "ts": float(lsn),
        "status": status,
        "readings": {"temperature_c": 20.0, "humidity_pct": humidity, "soil_moisture_pct": 30.0},
    }
    return StoredRecord(gateway, "log1", lsn, {"kind": "telemetry", "device": device, "body": body})


def test_windows_and_lineage_name_exactly_the_records_used():
    records = [_reading("gw1", lsn) for lsn in range(1, 21)]  # 20 readings: windows at 0 and 4 (of 8)
    records += [_reading("gw1", 50, humidity=None), _reading("gw1", 51, status="fault")]  # not usable
    records += [_reading("gw2", lsn) for lsn in range(1, 9)]
    windows, lineage = windows_from_records(records, window=8, gateways={"gw1"})
    assert windows.shape == (4, 8, 3)  # starts 0, 4, 8, 12
    assert lineage["sources"] == {"gw1": {"log1": [[1, 20]]}} and lineage["records"] == 20
    assert lsn_runs([5, 1, 2, 3, 9]) == [[1, 3], [5, 5], [9, 9]]


def test_summary_keeps_features_live_figures_phase_and_an_eta():
    events = JobEvents()
    assert events.eta_s() is None
    features = {"compression": "adaptive+gist", "sync": "on", "balance": "off", "toggle": "on"}
    events.extend(
        [
            {"event": "phase", "phase": "starting"},
            {"event": "start", "total_steps": 10, "features": features},
            {"event": "phase", "phase": "training"},
            {
                "event": "step",
                "step": 1,
                "time": 100.0,
                "compression": {"ratio": 2.0},
                "sync": {"blocked_s": 0.1},
            },
        ]
    )
    assert events.eta_s() is None  # one step: no rate yet
    events.extend(
        [{"event": "step", "step": 3, "time": 104.0, "toggle": {"selected": 5}, "sync": {"blocked_s": 0.2}}]
    )
    summary = events.summary
    assert summary["features"] == features and summary["phase"] == "training"
    assert summary["live"] == {
        "compression": {"ratio": 2.0},
        "sync": {"blocked_s": 0.2},
        "toggle": {"selected": 5},
    }
    assert events.eta_s() == 14.0  # 7 steps left at 2 s a step
    events.extend([{"event": "step", "step": 10, "time": 118.0}, {"event": "phase", "phase": "evaluating"}])
    assert events.eta_s() == 0.0 and events.summary["phase"] == "evaluating"
