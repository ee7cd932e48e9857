"""The fleet load driver (bench/_fleet_load.py) against a real cloudd: 50 light gateways (real
EpochLogs, gatewayd's Uplink, heartbeats) from two worker processes, a backlog in every log and then
a few seconds at a steady pace. Every record each gateway appended is stored exactly once, every
heartbeat was answered, and the fleet view knows all 50 gateways. No figure is asserted: speed is
the bench's (bench/fleet.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench._fleet_load import FleetUnreachable, run_fleet
from bench._fleet_plan import (
    FleetPlan,
    Stage,
    drain_figures,
    fleet_gateways,
    stage_figures,
    verify_exactly_once,
)
from tests.harness.cloud_http import call
from tests.harness.cloudd import OPERATOR_TOKEN, make_cloudd
from tests.harness.processes import free_port

GATEWAYS = 50


@pytest.mark.timeout(180)
def test_fifty_gateways_store_every_record_exactly_once(tmp_path: Path) -> None:
    server = make_cloudd(tmp_path / "cloud", gateways=fleet_gateways(GATEWAYS), extra_args=["--no-tasks"])
    server.start()
    try:
        plan = FleetPlan(
            url=server.url,
            gateways=GATEWAYS,
            records_per_batch=20,
            backlog_batches=3,
            stages=(Stage("backlog", 4.0, None), Stage("paced", 4.0, 1.0)),
            heartbeat_every_s=1.0,
            processes=2,
            log_root=str(tmp_path),
        )
        reports = run_fleet(plan)
        status, fleet = call(f"{server.url}/v1/fleet?limit=50&sort=backlog_records&desc=1", OPERATOR_TOKEN)
    finally:
        server.stop()

    check = verify_exactly_once(reports, ((r.gateway, r.log_id, r.lsn) for r in server.records()))
    appended = sum(last for r in reports for _, last in r.appended.values())
    # each gateway: its backlog plus one batch a second for the paced stage's 4 s
    assert appended >= GATEWAYS * (3 + 3) * 20
    assert check == {"appended": appended, "stored": appended, "missing": 0, "duplicates": 0, "unexpected": 0}
    assert status == 200 and {g["id"] for g in fleet["gateways"]} == set(fleet_gateways(GATEWAYS))
    beats = [status for r in reports for _, _, status in r.heartbeats]
    assert beats and set(beats) == {200}
    # the figures are computable from what was measured (their values are the bench's business)
    assert drain_figures(plan, reports)["batches_per_s"] > 0
    assert stage_figures(plan, reports, warmup_s=1.0)["paced"]["batches_per_s"] > 0


@pytest.mark.timeout(30)
def test_an_unreachable_cloud_fails_at_once_naming_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    plan = FleetPlan(
        url=url, gateways=2, stages=(Stage("paced", 1.0, 1.0),), processes=1, log_root=str(tmp_path)
    )
    began = time.monotonic()
    with pytest.raises(FleetUnreachable, match=url):
        run_fleet(plan)
    assert time.monotonic() - began < 10
