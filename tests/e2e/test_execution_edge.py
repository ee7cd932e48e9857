"""The gateway executes its placement plan, on real processes: mosquitto, cloudd, gatewayd with a
devicesim camera and sensor telemetry.

Camera inference starts placed in the cloud (a `[placement] pins` setting of the config file): the
gateway writes FrameForCloud records (the JPEGs as blobs) and infers nothing; a pin of summarise to
the edge changes nothing (it runs after infer, in the cloud). Pins through the control plane move
both back to the edge: a camera marker, then CameraEvents that say they ran at the
edge. Every delivered frame becomes exactly one record (no seq twice, none missing), on one side of
the marker. cloudd infers each uploaded frame once, with the model version the gateway named, and
stores the event under the frame's LSN. Sensor windows become aggregates and detections, with
alerts for the device whose readings leave their bounds, and every logged telemetry record lies in
exactly one edge window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protocol.derived import derived_log_id, parse_derived
from protocol.topics import telemetry_topic
from tests.harness.camera import DevicesimCamera
from tests.harness.cloudd import cloudd_token, make_cloudd
from tests.harness.gatewayctl import broker_args, ctl_json
from tests.harness.gatewayd import Gatewayd, telemetry, write_config
from tests.harness.live_trace import tasks_caught_up
from tests.harness.mqtt import publish
from tests.harness.poll import wait_until
from tests.harness.processes import free_port

pytestmark = pytest.mark.slow  # four processes and a live camera

SAMPLES = 40  # per device, 10 per second of receive time at most


def config_text(camera_url: str, blob_dir: Path) -> str:
    return (
        f'blob_dir = "{blob_dir}"\n'  # still inside write_config's [uplink]
        "[log]\nflush_interval_ms = 50\n"
        '[placement]\nprobe_interval_s = 1.0\npins = { "camera/infer" = "cloud" }\n'
        "[sensor]\nwindow_s = 0.5\n[sensor.bounds]\ntemperature_c = { high = 40.0 }\n"
        f'[camera]\nenabled = true\ncamera_id = "cam1"\nsource = "{camera_url}"\n'
        "open_timeout_s = 3.0\nread_timeout_s = 3.0\nbackoff_initial_s = 0.2\nbackoff_max_s = 1.0\n"
    )


def test_gateway_runs_camera_and_sensor_tasks_where_the_plan_says(tmp_path: Path, mosquitto) -> None:
    cloud = make_cloudd(tmp_path, gateways=("gw1",))
    cloud.start()
    camera = DevicesimCamera(free_port(), tmp_path / "truth.jsonl", seed=3, fps=4.0)
    config, http_port = write_config(
        tmp_path,
        mosquitto.url,
        cloud_url=cloud.url,
        token=cloudd_token("gw1"),
        extra=config_text(camera.url, tmp_path / "blobs"),
    )
    gw = Gatewayd(config, http_port)

    def cam() -> dict[str, Any]:
        return gw.status()["camera"]

    try:
        gw.wait_ready()
        # (a) infer in the cloud: frames go up, the engine runs nothing
        wait_until(lambda: cam()["events"]["frames_for_cloud"] >= 4, 45, "frames sent for cloud inference")
        status = cam()
        assert status["sides"] == {"infer": "cloud", "summarise": "cloud"}, status
        assert status["engine"]["submitted"] == 0 and status["events"]["frames_inferred_here"] == 0

        # sensor telemetry meanwhile: s2 runs hot, s1 does not
        messages = []
        for seq in range(SAMPLES):
            messages.append((telemetry_topic("gw1", "s1"), telemetry("s1", seq)))
            hot = {"temperature_c": 45.0}
            messages.append((telemetry_topic("gw1", "s2"), telemetry("s2", seq, readings=hot)))
        publish(mosquitto.port, messages)

        # (b) the control plane pins infer to the edge: the camera switches over
        ctl = broker_args(mosquitto.url, timeout_s=20)
        ctl_json(*ctl, "placement", "pin", "camera", "summarise", "edge")
        assert cam()["sides"] == {"infer": "cloud", "summarise": "cloud"}  # it follows infer to the cloud
        ctl_json(*ctl, "placement", "pin", "camera", "infer", "edge")
        wait_until(lambda: cam()["events"]["frames_inferred_here"] >= 4, 45, "frames inferred at the edge")
        assert cam()["sides"] == {"infer": "edge", "summarise": "edge"}

        camera.stop()
        wait_until(lambda: cam()["engine"]["pending"] == 0 and cam()["capture"]["queued"] == 0, 20, "idle")
        gw.wait_status(lambda s: s["ingest"]["windows_open"] == 0, 20, "every sensor window closed")
        status = gw.status()
        log_id, logged = status["log"]["log_id"], status["log"]["next_lsn"] - 1
        wait_until(lambda: cloud.count_records("gw1", log_id) >= logged, 45, "every record uploaded")
        wait_until(lambda: tasks_caught_up(cloud.status(), log_id, logged), 60, "cloudd ran its tasks")
    finally:
        camera.stop()
        gw.terminate()
        cloud.stop()

    everything = cloud.records("gw1")
    stored = sorted((r for r in everything if r.log_id == log_id), key=lambda r: r.lsn)
    assert len({r.lsn for r in stored}) == len(stored)  # stored once each
    events = [(r.lsn, r.record["body"]) for r in stored if r.record["kind"] == "event"]
    camera_markers = [
        (lsn, b) for lsn, b in events if b.get("type") == "placement" and b["service"] == "camera"
    ]
    assert camera_markers[0][1]["reason"] == "start", camera_markers
    infer_sides = [m["sides"]["infer"] for _, m in camera_markers]
    changes = [side for k, side in enumerate(infer_sides) if k == 0 or side != infer_sides[k - 1]]
    assert changes[-2:] == ["cloud", "edge"], camera_markers  # (an edge start before the first plan)
    back_at = camera_markers[-1][0]
    for_cloud = [(lsn, parse_derived(b)) for lsn, b in events if b.get("type") == "frame"]
    edge_events = [(lsn, b) for lsn, b in events if b.get("source") == "cam1" and "ran_at" in b]
    assert for_cloud and edge_events
    assert all(lsn < back_at for lsn, _ in for_cloud)  # no frame went up after the switch back
    assert all(f.model == "scene" and f.blob["content_type"] == "image/jpeg" for _, f in for_cloud)
    assert all(b["ran_at"] == {"infer": "edge", "summarise": "edge"} for _, b in edge_events)
    assert all(b["severity"] in ("info", "alert") for _, b in edge_events)
    assert sum(lsn > back_at for lsn, _ in edge_events) >= 4
    # each delivered frame became exactly one record, on one side
    seqs = [f.seq for _, f in for_cloud] + [b["seq"] for _, b in edge_events]
    assert len(seqs) == len(set(seqs))
    engine, capture, counters = (
        status["camera"]["engine"],
        status["camera"]["capture"],
        status["camera"]["events"],
    )
    assert len(for_cloud) == counters["frames_for_cloud"]
    assert capture["delivered"] == counters["frames_for_cloud"] + engine["submitted"]
    assert engine["dropped"] == engine["failed"] == 0 and len(edge_events) == engine["inferred"]

    # cloudd inferred each uploaded frame once, with the version the gateway ran, under its LSN
    made_in_cloud = [r for r in everything if r.log_id == derived_log_id(log_id, "camera/summarise")]
    assert sorted(r.lsn for r in made_in_cloud) == sorted(lsn for lsn, _ in for_cloud)
    by_lsn = dict(for_cloud)
    for r in made_in_cloud:
        event, frame = r.record["body"], by_lsn[r.lsn]
        assert event["ran_at"] == {"infer": "cloud", "summarise": "cloud"}, event
        assert (event["seq"], event["input"]) == (frame.seq, r.lsn)
        assert (event["model"], event["model_version"]) == (frame.model, frame.model_version)

    # sensor windows: every telemetry record in exactly one edge window; s2's windows are alerts
    telemetry_lsns = {(r.lsn, r.record["device"]) for r in stored if r.record["kind"] == "telemetry"}
    assert len(telemetry_lsns) == 2 * SAMPLES
    aggregates = [parse_derived(b) for _, b in events if b.get("type") == "sensor_aggregate"]
    detections = [parse_derived(b) for _, b in events if b.get("type") == "sensor_detection"]
    covered = [
        (lsn, device)
        for lsn, device in telemetry_lsns
        for a in aggregates
        if a.window.device == device and a.window.first_lsn <= lsn <= a.window.last_lsn
    ]
    assert sorted(covered) == sorted(telemetry_lsns)
    assert sum(a.samples for a in aggregates) == 2 * SAMPLES
    assert all(a.ran_at == {"aggregate": "edge", "detect": "edge"} for a in aggregates)
    assert len(detections) == len(aggregates)
    assert {d.window.device for d in detections if d.severity == "alert"} == {"s2"}
    assert all(d.anomalous for d in detections if d.window.device == "s2")
