"""cloudd's side of the scheduler without torchrun: the settings (flags and [scheduler] file), the
job table's preempted state and its added columns (an older table gains them), and the real
backend's rounds over a fake clock: a start, a preemption held back by the run's lease term and
then carried out by revoking the lease file, a start that waits until the devices are free."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cloud.jobs.backend import TorchrunBackend
from cloud.jobs.runner import Run
from cloud.jobs.scheduling import SchedulerConfigError, parse_nodes, scheduler_settings
from cloud.jobs.table import JobTable
from cloud.scheduler.cluster import Node


def test_default_settings_are_fifo_on_one_local_node():
    settings = scheduler_settings(default_devices=4)
    assert settings.nodes == (Node("local", 4, "cpu"),) and settings.policy == "fifo"
    assert settings.devices == 4


def test_flags_override_the_file_and_bad_input_names_the_field(tmp_path):
    config = tmp_path / "s.toml"
    config.write_text(
        '[scheduler]\npolicy = "fifo"\nmin_run_s = 5\n'
        '[[scheduler.nodes]]\nname = "a"\ndevices = 2\ngeneration = "v100"\n'
    )
    settings = scheduler_settings(default_devices=4, config_file=config, overrides={"policy": "las"})
    assert settings.policy == "las" and settings.min_run_s == 5 and settings.nodes == (Node("a", 2, "v100"),)
    assert parse_nodes("x:2,y:4:k80") == (Node("x", 2, "cpu"), Node("y", 4, "k80"))
    for bad, field in [
        ({"nodes": "x:two"}, "--nodes"),
        ({"overrides": {"policy": "nope"}}, "scheduler.policy"),
        ({"overrides": {"round_interval_s": 0}}, "scheduler.round_interval_s"),
    ]:
        with pytest.raises(SchedulerConfigError, match=field):
            scheduler_settings(default_devices=4, **bad)
    config.write_text('[scheduler]\nnodes = [{name = "a", devices = 0}]\n')
    with pytest.raises(SchedulerConfigError, match=r"scheduler.nodes\[0\]: node.devices"):
        scheduler_settings(default_devices=4, config_file=config)


def test_an_older_job_table_gains_the_scheduler_columns(tmp_path):
    path = tmp_path / "jobs.sqlite"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, spec TEXT NOT NULL, state TEXT "
        "NOT NULL, created_ts REAL NOT NULL, started_ts REAL, finished_ts REAL, exit_code INTEGER, "
        "error TEXT, model TEXT, lineage TEXT)"
    )
    old.execute(
        "INSERT INTO jobs VALUES ('job-00001', 1, '{}', 'queued', 1.0, NULL, NULL, NULL, NULL, NULL, NULL)"
    )
    old.commit()
    old.close()
    table = JobTable(path)
    row = table.get("job-00001")
    assert (row.attained_service_s, row.steps_done, row.throughput, row.preemptions) == (0.0, 0, {}, 0)
    table.set_state(row.id, "running", started_ts=2.0)
    table.set_state(row.id, "preempted", attained_service_s=8.0, throughput={"cpu": 3.5}, preemptions=1)
    row = table.set_state(row.id, "running")
    assert row.throughput == {"cpu": 3.5} and row.preemptions == 1 and row.attained_service_s == 8.0
    table.set_state(row.id, "queued")  # cloudd stopped under it
    with pytest.raises(ValueError):
        table.set_state(row.id, "preempted")  # only a running job is preempted


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _backend(tmp_path: Path, clock: _Clock, owned: list[tuple[str, Run]]) -> TorchrunBackend:
    settings = scheduler_settings(
        default_devices=2, overrides={"policy": "las", "min_run_s": 5.0}, nodes="local:2:cpu"
    )
    for job in ("job-00001", "job-00002"):
        (tmp_path / job).mkdir()
    return TorchrunBackend(
        settings,
        lambda job_id: tmp_path / job_id,
        lambda job_id, run: owned.append((job_id, run)),
        lambda job_id, why: None,
        max_running=1,
        clock=clock,
    )


def test_a_preemption_waits_for_the_lease_term_then_revokes_the_lease(tmp_path):
    clock, owned = _Clock(), []
    backend = _backend(tmp_path, clock, owned)
    table = JobTable(tmp_path / "jobs.sqlite")
    backend.add(table.insert({"nproc": 2, "max_steps": 100}, now=100.0))
    backend.round()
    assert [job for job, _ in owned] == ["job-00001"]
    run = owned[0][1]
    (run.workdir / "lease").touch()  # what the runner does before torchrun
    clock.t = 110.0
    backend.add(table.insert({"nproc": 2, "max_steps": 10}, now=110.0))
    backend.round()  # LAS: job 2 (0 device-s) over job 1 (20), but job 1 has not trained yet
    assert not run.revoked and backend.decisions["job-00001"]["applied"] is False
    run.steps += [(1, 111.0), (40, 113.0)]
    clock.t = 114.0
    backend.round()  # 3 s of training < 5 s
    assert not run.revoked
    clock.t = 116.5
    backend.round()  # 5.5 s: revoked; job 2 waits while job 1 still holds the devices
    assert run.revoked and not (run.workdir / "lease").exists() and len(owned) == 1
    assert backend.decisions["job-00002"]["applied"] is False
    state = backend.ended("job-00001", "preempted")
    assert state.status == "preempted" and state.preemptions == 1
    assert state.attained_service == pytest.approx(2 * 16.5) and state.throughput == {
        "cpu": pytest.approx(19.5)
    }
    backend.round()
    assert [job for job, _ in owned] == ["job-00001", "job-00002"]
    assert backend.queue_entry("job-00001").state == "waiting"
