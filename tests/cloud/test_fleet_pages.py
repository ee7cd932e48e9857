"""The gateway, device and alert APIs against a real cloudd: telemetry uploaded as a gateway does
comes back as the device's chart (raw for a short window, downsampled for a long one), gaps in seq
are counted, alerts list and stay acknowledged across a restart, and the fleet pages and sorts on
the server."""

from __future__ import annotations

import csv
import io
import json
import urllib.request

from protocol.batch import encode_batch, idempotency_key
from protocol.records import event_record
from tests.harness.cloud_http import call, heartbeat, post, telemetry_batch
from tests.harness.cloudd import OPERATOR_TOKEN as OP
from tests.harness.cloudd import cloudctl, cloudd_token, start_cloudd


def _upload(url: str, gateway: str, body: bytes, key: str) -> dict:
    status, ack = post(
        f"{url}/v1/gateways/{gateway}/batches",
        body,
        {"Idempotency-Key": key, "Authorization": f"Bearer {cloudd_token(gateway)}"},
    )
    assert status == 200, ack
    return ack


def _telemetry(url: str, first: int, count: int) -> None:
    body, key = telemetry_batch("gw1", "aaaa0001", "sensor-000", first, count)
    _upload(url, "gw1", body, key)


def _alert(url: str, lsn: int, score: float) -> None:
    record = event_record(
        "sensor-000", 1000.0 + lsn, {"type": "sensor_detection", "severity": "alert", "score": score}
    )
    _upload(
        url,
        "gw1",
        encode_batch("gw1", "bbbb0002", [(lsn, record)]),
        idempotency_key("gw1", "bbbb0002", lsn, lsn),
    )


def _device(url: str, query: str) -> dict:
    status, doc = call(f"{url}/v1/devices/gw1/sensor-000?{query}", OP)
    assert status == 200, doc
    return doc


def test_device_window_gaps_and_csv(tmp_path):
    server = start_cloudd(tmp_path)
    try:
        _telemetry(server.url, 1, 300)  # seq 1..300 at received_ts 1001..1300
        _telemetry(server.url, 1, 300)  # a replay: stored once, counted once
        _telemetry(server.url, 311, 90)  # seq 301..310 never arrive: 10 missing
        doc = _device(server.url, "start=1000&end=1401&points=600")
        assert doc["last_message"]["seq"] == 400
        assert doc["window"]["messages"] == 390 and doc["window"]["gaps"] == 10
        chart = doc["chart"]
        assert chart["width"] == 0  # under a second per point: one point per message
        sent_body, _ = telemetry_batch("gw1", "aaaa0001", "sensor-000", 1, 300)
        sent = {
            r["data"]["body"]["seq"]: r["data"]["body"]["readings"] for r in json.loads(sent_body)["records"]
        }
        temperature = dict(zip(chart["seq"]["temperature_c"], chart["series"]["temperature_c"], strict=True))
        for seq in (1, 77, 300):
            assert temperature[seq][1] == sent[seq]["temperature_c"]
            assert temperature[seq][0] == 1000.0 + seq

        week = _device(server.url, f"start=0&end={7 * 86400}&points=600")
        assert week["chart"]["width"] == 600  # a week is read from the 10-minute rows
        points = week["chart"]["series"]["humidity_pct"]
        assert 1 <= len(points) <= 600
        assert sum(p[4] for p in points) == 390  # every humidity reading, each once
        later_body, _ = telemetry_batch("gw1", "aaaa0001", "sensor-000", 311, 90)
        later = [r["data"]["body"]["readings"]["humidity_pct"] for r in json.loads(later_body)["records"]]
        everything = [r["humidity_pct"] for r in sent.values()] + later
        assert min(p[2] for p in points) == min(everything) and max(p[3] for p in points) == max(everything)

        request = urllib.request.Request(
            f"{server.url}/v1/devices/gw1/sensor-000/series.csv?start=1000&end=1101",
            headers={"Authorization": f"Bearer {OP}"},
        )
        with urllib.request.urlopen(request) as response:
            rows = list(csv.DictReader(io.StringIO(response.read().decode())))
        soil = [r for r in rows if r["reading"] == "soil_moisture_pct"]
        assert len(soil) == 100 and float(soil[0]["mean"]) == sent[1]["soil_moisture_pct"]

        assert call(f"{server.url}/v1/devices/gw1/nobody", OP)[0] == 404
        status, error = call(f"{server.url}/v1/devices/gw1/sensor-000?start=5&end=4", OP)
        assert status == 400 and error["detail"].startswith("start")
    finally:
        server.stop()


def test_alerts_acknowledged_survive_a_restart(tmp_path):
    server = start_cloudd(tmp_path)
    try:
        for lsn in (1, 2, 3):
            _alert(server.url, lsn, score=lsn)
        _alert(server.url, 2, score=2)  # a replay is no second alert
        status, doc = call(f"{server.url}/v1/alerts?gateway=gw1", OP)
        assert status == 200 and [a["lsn"] for a in doc["alerts"]] == [3, 2, 1]
        assert doc["open"] == {"gw1": 3}
        newest = doc["alerts"][0]["id"]
        status, ack = call(f"{server.url}/v1/alerts/ack", OP, "POST", {"ids": [newest]})
        assert status == 200 and ack["acknowledged"] == 1
        assert call(f"{server.url}/v1/alerts/ack", OP, "POST", {"ids": "all"})[0] == 400
        server.stop()
        server.start()
        status, doc = call(f"{server.url}/v1/alerts?open=1", OP)
        assert [a["lsn"] for a in doc["alerts"]] == [2, 1]
        status, fleet = call(f"{server.url}/v1/fleet", OP)
        assert fleet["totals"]["open_alerts"] == 2
        assert {g["id"]: g["alerts"] for g in fleet["gateways"]}["gw1"] == 2
    finally:
        server.stop()


def test_fleet_pages_sorts_and_gateway_document(tmp_path):
    gateways = tuple(f"gw{i:02d}" for i in range(1, 31))
    server = start_cloudd(tmp_path, gateways=gateways)
    try:
        for i, gw in enumerate(gateways[:20]):
            beat = heartbeat(gw, backlog=i * 10, cloud_tasks=("detect",) if i % 2 else (), sent_ts=2.0)
            if i == 3:
                beat["services"] = [{"service": "sensor", "state": "degraded", "detail": "broker flaps"}]
            status, _ = call(f"{server.url}/v1/gateways/{gw}/heartbeat", cloudd_token(gw), "POST", beat)
            assert status == 200
        status, page = call(f"{server.url}/v1/fleet?sort=backlog_records&desc=1&limit=5&offset=0", OP)
        assert status == 200
        assert page["totals"] == {
            "gateways": 30,
            "online": 19,
            "degraded": 1,
            "offline": 10,
            "backlog_records": sum(i * 10 for i in range(20)),
            "open_alerts": 0,
        }
        assert [g["id"] for g in page["gateways"]] == ["gw20", "gw19", "gw18", "gw17", "gw16"]
        status, page = call(f"{server.url}/v1/fleet?state=offline&limit=4&offset=8", OP)
        assert [g["id"] for g in page["gateways"]] == ["gw29", "gw30"] and page["page"]["matched"] == 10
        assert call(f"{server.url}/v1/fleet?sort=nope", OP)[0] == 400

        moved = heartbeat("gw02", cloud_tasks=("detect", "aggregate"), sent_ts=3.0)
        moved["counters"] = {
            "log_bytes": 5000,
            "log_budget_bytes": 20000,
            "rejected": {"schema": 3},
            "uplink": {"batches_sent": 7.0},
        }
        call(f"{server.url}/v1/gateways/gw02/heartbeat", cloudd_token("gw02"), "POST", moved)
        status, gw = call(f"{server.url}/v1/gateways/gw02", OP)
        assert status == 200
        assert (gw["cloud_tasks"], gw["tasks"]) == (2, 3)
        assert len(gw["history"]) == 2 and gw["history"][-1]["rtt_ms"] == 40.0
        assert gw["history"][-1]["log_bytes"] == 5000 and gw["history"][0]["log_bytes"] is None
        assert gw["counters"]["rejected"] == {"schema": 3} and gw["counters"]["log_budget_bytes"] == 20000
        assert gw["placement_changes"][0]["task"] == "aggregate"  # newest first
        assert call(f"{server.url}/v1/gateways/nobody", OP)[0] == 404

        ctl = cloudctl("--url", server.url, "--token", OP, "gateway", "gw02")
        assert ctl.returncode == 0, ctl.stderr
        assert "gateway gw02: online" in ctl.stdout and "placement: 2 of 3 tasks in the cloud" in ctl.stdout
        ctl = cloudctl(
            "--url", server.url, "--token", OP, "fleet", "--sort", "backlog_records", "--desc", "--limit", "3"
        )
        assert ctl.returncode == 0, ctl.stderr
        assert [line.split()[0] for line in ctl.stdout.splitlines()[1:4]] == ["gw20", "gw19", "gw18"]
        assert (
            "rows 1-3 of 30; 19 online, 1 degraded, 10 offline of 30; 1890 records in backlogs"
            in ctl.stdout  # gw02 reported 0 since
        )
        assert cloudctl("--url", server.url, "--token", OP, "gateway", "nobody").returncode == 1
    finally:
        server.stop()
