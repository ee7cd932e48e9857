"""cloudd runs the tasks a placement plan gives the cloud (cloud/tasks), against a real cloudd process:
gateway logs uploaded as a gateway's uplink sends them, blobs PUT as gateway/uplink/blobs.py does,
and what cloudd stored read back from its data directory."""

from __future__ import annotations

import functools
import hashlib
import json
import urllib.request
from pathlib import Path
from typing import Any

import cv2
import numpy as np

import models
from models.artifact import load_artifact
from models.inference import InferenceInput, load_and_probe, run_batch
from models.sensing import WindowBook, aggregate
from models.synthetic_scene import background, render
from protocol.batch import encode_batch, idempotency_key
from protocol.derived import (
    Bounds,
    CameraParams,
    FrameForCloud,
    InferenceResult,
    LogGap,
    PlacementMarker,
    SensorParams,
    derived_log_id,
)
from protocol.events import InferenceEvent
from protocol.records import Record, encode_record
from tests.harness.cloud_http import post
from tests.harness.cloudd import start_cloudd
from tests.harness.poll import wait_until

GW = "gw1"
LOG = "0123abcd"
CLOUD = {"aggregate": "cloud", "detect": "cloud"}
EDGE_AGG = {"aggregate": "edge", "detect": "cloud"}
PARAMS = SensorParams(window_s=1.0, bounds={"temperature_c": Bounds(high=30.0)})


# --- a gateway log, as records ----------------------------------------------------------------------


def marker(sides: dict[str, str], service: str = "sensor", reason: str = "plan") -> Record:
    body = PlacementMarker(
        service=service,  # type: ignore[arg-type]
        sides=sides,  # type: ignore[arg-type]
        plan=1,
        reason=reason,  # type: ignore[arg-type]
        sensor=PARAMS if service == "sensor" else None,
        camera=CameraParams() if service == "camera" else None,
    )
    return event("gateway", 0.0, body.model_dump(mode="json"))


def event(device: str, ts: float, body: dict[str, Any]) -> Record:
    return Record(kind="event", device=device, received_ts=ts, body=body)


def telemetry(device: str, ts: float, temperature: float) -> Record:
    body = {
        "v": 1,
        "device": device,
        "seq": 0,
        "ts": ts,
        "readings": {"temperature_c": temperature},
        "status": "ok",
    }
    return Record(kind="telemetry", device=device, received_ts=ts, body=body)


def sensor_stream(first_ts: float, seconds: int, devices: tuple[str, ...] = ("a", "b")) -> list[Record]:
    """Four samples per device per second; device "a" runs hot (an alert) in the second second."""
    out = []
    for i in range(seconds * 4):
        ts = first_ts + i * 0.25
        for device in devices:
            hot = device == "a" and 1 <= i // 4 < 2
            out.append(telemetry(device, ts, 40.0 if hot else 20.0 + (i % 3)))
    return out


def upload(cloudd, entries: list[tuple[int, Record]], log_id: str = LOG) -> dict:
    entries = sorted(entries, key=lambda e: e[0])
    body = encode_batch(GW, log_id, [(lsn, encode_record(r)) for lsn, r in entries])
    headers = {
        "Idempotency-Key": idempotency_key(GW, log_id, entries[0][0], entries[-1][0]),
        "Authorization": f"Bearer {cloudd.token_for(GW)}",
    }
    status, ack = post(f"{cloudd.url}/v1/gateways/{GW}/batches", body, headers)
    assert status == 200, ack
    return ack


def numbered(records: list[Record], first_lsn: int = 1) -> list[tuple[int, Record]]:
    return list(enumerate(records, start=first_lsn))


# --- what cloudd stored -----------------------------------------------------------------------------


def results(cloudd, task: str, log_id: str = LOG) -> dict[int, dict]:
    """The bodies cloudd stored for ``task`` of ``log_id``, by the LSN of their input (each once: a
    second record at one LSN would fail here)."""
    found: dict[int, dict] = {}
    for stored in cloudd.records(GW):
        if stored.log_id == derived_log_id(log_id, task):
            assert stored.lsn not in found, f"{task} stored twice at {stored.lsn}"
            found[stored.lsn] = stored.record["body"]
    return found


def tasks_status(cloudd) -> dict:
    return cloudd.status()["tasks"]


def log_status(cloudd, log_id: str = LOG) -> dict:
    found = [item for item in tasks_status(cloudd)["logs"] if item["log_id"] == log_id]
    if not found:
        raise LookupError(f"cloudd's task runner has not seen log {log_id} yet")
    return found[0]


def expected_windows(entries: list[tuple[int, Record]]) -> list[tuple[str, float, int, int]]:
    """(device, start_ts, first_lsn, samples) of each window the gateway's own WindowBook cuts."""
    book = WindowBook(CLOUD, PARAMS)
    closed = []
    for lsn, record in sorted(entries, key=lambda e: e[0]):
        if record.kind == "telemetry":
            closed += book.feed(lsn, record.device, record.received_ts, record.body)
        elif record.body.get("type") == "placement":
            closed += book.feed_marker(PlacementMarker.model_validate(record.body))
        else:
            closed += book.feed_other(record.received_ts)
    return sorted((w.device, w.ref.start_ts, w.first_lsn, w.samples) for w in closed)


def windows_of(aggregates: dict[int, dict]) -> list[tuple[str, float, int, int]]:
    return sorted(
        (a["window"]["device"], a["window"]["start_ts"], a["window"]["first_lsn"], a["samples"])
        for a in aggregates.values()
    )


def held_back(cloudd, log_id: str, hole: int) -> bool:
    status = log_status(cloudd, log_id)
    return status["buffered"] > 0 and status["next_lsn"] == hole


def wait_processed(cloudd, next_lsn: int, log_id: str = LOG) -> None:
    wait_until(
        lambda: log_status(cloudd, log_id)["next_lsn"] >= next_lsn, 30, f"{log_id} processed to {next_lsn}"
    )


# --- sensor -----------------------------------------------------------------------------------------


def test_cloud_windows_make_their_aggregate_and_detection_once(cloudd):
    log = numbered([marker(CLOUD), *sensor_stream(100.0, 4), marker(CLOUD)])
    upload(cloudd, log[: len(log) // 2])
    upload(cloudd, log)  # overlaps the first: each record stored once, processed once
    wait_processed(cloudd, len(log) + 1)
    aggregates = results(cloudd, "sensor/aggregate")
    detections = results(cloudd, "sensor/detect")
    assert windows_of(aggregates) == expected_windows(log)
    assert sum(a["samples"] for a in aggregates.values()) == sum(r.kind == "telemetry" for _, r in log)
    assert set(detections) == set(aggregates)
    assert all(a["ran_at"] == CLOUD and not a["recovered"] for a in aggregates.values())
    alerts = {
        (d["window"]["device"], d["window"]["start_ts"])
        for d in detections.values()
        if d["severity"] == "alert"
    }
    assert alerts == {("a", 101.0)}  # the hot second of device "a", and only it
    assert tasks_status(cloudd)["made"]["sensor/aggregate"] == len(aggregates)


def test_an_upload_wakes_the_task_runner(tmp_path):
    """With polling an hour apart, results still come: each stored batch wakes the runner."""
    cloudd = start_cloudd(tmp_path / "cloudd", extra_args=["--tasks-poll-interval", "3600"])
    try:
        wait_until(lambda: tasks_status(cloudd)["passes"] >= 1, 20, "the first pass (at start)")
        log = numbered([marker(CLOUD), *sensor_stream(100.0, 3), marker(CLOUD)])
        upload(cloudd, log)
        wait_processed(cloudd, len(log) + 1)
        assert windows_of(results(cloudd, "sensor/aggregate")) == expected_windows(log)
        assert tasks_status(cloudd)["wakeups"] >= 1
    finally:
        cloudd.stop()


def test_edge_aggregates_get_their_detection_in_the_cloud_and_a_crashed_window_is_recovered(cloudd):
    stream = sensor_stream(200.0, 3, devices=("a",))
    log = numbered([marker(EDGE_AGG), *stream])
    # The gateway aggregates each window it closes, as gateway/ingest does, except the last one: it
    # crashed before closing it, and its next start writes a marker.
    book = WindowBook(EDGE_AGG, PARAMS)
    entries: list[tuple[int, Record]] = []
    lsn = 1
    for _, record in log:
        entries.append((lsn, record))
        lsn += 1
        closed = (
            book.feed(lsn - 1, record.device, record.received_ts, record.body)
            if record.kind == "telemetry"
            else book.feed_marker(PlacementMarker.model_validate(record.body))
        )
        for window in closed:
            entries.append((lsn, event("a", record.received_ts, aggregate(window).model_dump(mode="json"))))
            lsn += 1
    (crashed,) = book.close_all()
    entries.append((lsn, marker(EDGE_AGG, reason="start")))
    upload(cloudd, entries)
    wait_processed(cloudd, lsn + 1)

    detections = results(cloudd, "sensor/detect")
    aggregates = results(cloudd, "sensor/aggregate")
    edge_windows = [
        e.body["window"]["first_lsn"] for _, e in entries if e.body.get("type") == "sensor_aggregate"
    ]
    assert sorted(detections) == sorted([*edge_windows, crashed.first_lsn])
    assert all(d["ran_at"]["detect"] == "cloud" for d in detections.values())
    assert list(aggregates) == [crashed.first_lsn]  # the cloud aggregates only the crashed window
    recovered = aggregates[crashed.first_lsn]
    assert recovered["recovered"] is True and recovered["samples"] == crashed.samples
    assert recovered["ran_at"] == CLOUD


def test_a_hole_holds_processing_until_filled_or_covered_by_a_log_gap(cloudd):
    for log_id in ("aaaa0001", "aaaa0002"):
        log = numbered([marker(CLOUD), *sensor_stream(300.0, 3), marker(CLOUD)])
        hole = 12
        held_here = functools.partial(held_back, cloudd, log_id, hole)
        upload(cloudd, [e for e in log if e[0] != hole], log_id)
        wait_until(held_here, 30, "records held behind the hole")
        held = results(cloudd, "sensor/aggregate", log_id)
        assert all(a["window"]["first_lsn"] < hole for a in held.values())
        # Windows the records after the hole would close are not decided yet.
        assert len(held) < len(expected_windows(log))
        if log_id == "aaaa0001":
            upload(cloudd, [e for e in log if e[0] == hole], log_id)  # the hole filled: all of it counts
            wait_processed(cloudd, len(log) + 1, log_id)
            assert windows_of(results(cloudd, "sensor/aggregate", log_id)) == expected_windows(log)
        else:  # the gateway dropped it (drop_oldest): its LogGap comes later in the log
            gap = event("gateway", 400.0, LogGap(first=hole, last=hole).model_dump(mode="json"))
            upload(cloudd, [(len(log) + 1, gap)], log_id)
            wait_processed(cloudd, len(log) + 2, log_id)
            rest = [e for e in log if e[0] != hole]
            assert windows_of(results(cloudd, "sensor/aggregate", log_id)) == expected_windows(rest)
            assert log_status(cloudd, log_id)["gap_lsns"] == 1


def test_a_restart_in_the_middle_loses_and_doubles_nothing(cloudd):
    log = numbered([marker(CLOUD), *sensor_stream(500.0, 6), marker(CLOUD)])
    half = len(log) // 2
    upload(cloudd, log[:half])
    wait_processed(cloudd, half + 1)
    before = results(cloudd, "sensor/aggregate")
    assert before  # some windows were decided, others are still open across the restart
    cloudd.kill()  # SIGKILL: no shutdown of any kind
    cloudd.start()
    upload(cloudd, log[half:])
    wait_processed(cloudd, len(log) + 1)
    after = results(cloudd, "sensor/aggregate")
    assert windows_of(after) == expected_windows(log)
    assert {lsn: after[lsn] for lsn in before} == before  # what was made before is what stays
    assert set(results(cloudd, "sensor/detect")) == set(after)


# --- camera -----------------------------------------------------------------------------------------


def jpeg_of(label: str) -> bytes:
    image = render(background(96, 96), [(label, (48.0, 48.0), 24.0)], 1.0, None)
    ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return encoded.tobytes()


def edge_inference(jpeg: bytes) -> tuple[str, float]:
    """The label and score the gateway's engine gives this frame with the factory model."""
    artifact = load_artifact(Path(models.__file__).resolve().parent / "artifacts" / "scene")
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    [result] = run_batch(load_and_probe(artifact, 1), [InferenceInput("cam1", 0, 0.0, image)])
    return result.event.label, result.event.score


def put_blob(cloudd, blob_id: str, data: bytes) -> dict:
    request = urllib.request.Request(
        f"{cloudd.url}/v1/gateways/{GW}/blobs/{blob_id}?offset=0&final=1",
        data=data,
        method="PUT",
        headers={
            "Authorization": f"Bearer {cloudd.token_for(GW)}",
            "X-Sha256": hashlib.sha256(data).hexdigest(),
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def frame_record(seq: int, blob_id: str, data: bytes, version: str = "1") -> Record:
    ref = {
        "id": blob_id,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "content_type": "image/jpeg",
    }
    frame = FrameForCloud(
        source="cam1",
        seq=seq,
        capture_ts=600.0 + seq,
        model="scene",
        model_version=version,
        camera=CameraParams(alert_score=0.0),
        blob=ref,
    )
    return event("cam1", 600.0 + seq, frame.model_dump(mode="json"))


def test_frames_are_inferred_in_the_cloud_once_their_blob_is_there(cloudd):
    circle, not_a_jpeg = jpeg_of("circle"), b"\xff\xd8 this is no image" * 10
    inference = InferenceEvent(
        type="classification",
        source="cam1",
        seq=9,
        capture_ts=609.0,
        model="scene",
        model_version="1",
        label="square",
        score=0.5,
    )
    summarise_only = InferenceResult(inference=inference, camera=CameraParams(alert_score=0.9))
    log = numbered(
        [
            marker({"infer": "cloud", "summarise": "cloud"}, service="camera"),
            frame_record(1, "f1", circle),
            frame_record(2, "f2", not_a_jpeg),
            frame_record(3, "f3", circle, version="no-such-version"),
            event("cam1", 609.0, summarise_only.model_dump(mode="json")),
        ]
    )
    put_blob(cloudd, "f2", not_a_jpeg)
    put_blob(cloudd, "f3", circle)
    upload(cloudd, log)
    wait_processed(cloudd, len(log) + 1)
    wait_until(lambda: tasks_status(cloudd)["waiting_blobs"] == 1, 30, "frame 1 waits for its blob")
    assert 2 not in results(cloudd, "camera/summarise")  # not skipped, not made: waiting
    put_blob(cloudd, "f1", circle)
    wait_until(lambda: tasks_status(cloudd)["waiting_blobs"] == 0, 60, "frame 1 inferred")

    events = results(cloudd, "camera/summarise")
    assert sorted(events) == [2, 3, 4, 5]  # one per input record, at its LSN
    inferred = events[2]
    assert (inferred["model"], inferred["model_version"]) == ("scene", "1")
    assert inferred["ran_at"] == {"infer": "cloud", "summarise": "cloud"} and inferred["input"] == 2
    assert (inferred["label"], inferred["score"]) == edge_inference(circle)  # what the gateway would say
    assert inferred["severity"] == "alert"  # alert_score 0: every label at any score
    assert (events[3]["type"], events[3]["reason"]) == ("task_failed", "frame_undecodable")
    assert (events[4]["type"], events[4]["reason"]) == ("task_failed", "model_unavailable")
    summarised = events[5]
    assert summarised["ran_at"] == {"infer": "edge", "summarise": "cloud"}
    assert (summarised["label"], summarised["severity"], summarised["input"]) == ("square", "info", 5)
    status = tasks_status(cloudd)
    assert status["failures"] == {"frame_undecodable": 1, "model_unavailable": 1}
    assert status["made"]["camera/summarise"] == 2  # the failures are counted apart


def test_a_frame_that_breaks_the_decoder_fails_alone_and_the_runner_goes_on(cloudd):
    """An empty blob (OpenCV raises on it rather than saying "no image") is one failure; it does
    not fail the pass, and the logs after it are processed and saved."""
    camera = numbered([marker({"infer": "cloud", "summarise": "cloud"}, service="camera")])
    camera.append((2, frame_record(1, "empty1", b"")))
    put_blob(cloudd, "empty1", b"")
    upload(cloudd, camera)
    wait_until(lambda: 2 in results(cloudd, "camera/summarise"), 30, "the empty frame's outcome")
    failed = results(cloudd, "camera/summarise")[2]
    assert (failed["type"], failed["reason"]) == ("task_failed", "frame_undecodable")
    sensor = numbered([marker(CLOUD), *sensor_stream(650.0, 2), marker(CLOUD)])
    upload(cloudd, sensor, "bbbb0001")
    wait_processed(cloudd, len(sensor) + 1, "bbbb0001")
    assert windows_of(results(cloudd, "sensor/aggregate", "bbbb0001")) == expected_windows(sensor)
    status = tasks_status(cloudd)
    assert (status["pass_errors"], status["gateway_errors"], status["waiting_blobs"]) == (0, 0, 0)
    assert log_status(cloudd)["next_lsn"] == len(camera) + 1  # its cursor was saved


def test_a_full_buffer_keeps_the_lowest_lsns_and_says_what_it_left_out():
    from cloud.tasks.cursor import LogCursor
    from cloud.tasks.replay import LeftOut, LogReplay

    replay = LogReplay(LogCursor(GW, LOG), max_buffered=3)
    records = dict(numbered([marker(CLOUD), *sensor_stream(700.0, 2, devices=("a",))]))
    for lsn, read_at in ((5, (1, 50)), (4, (1, 40)), (3, (1, 30)), (2, (1, 20))):  # the hole at 1 holds them
        replay.offer(lsn, records[lsn].model_dump(mode="json"), read_at)
    assert replay.left_out == LeftOut(5, (1, 50)) and replay.buffered == 3
    assert replay.advance() == [] and replay.next_lsn == 1 and not replay.needs_rescan
    replay.offer(1, records[1].model_dump(mode="json"), (1, 60))  # the lowest: it pushes 4 out too
    replay.advance()
    replay.offer(7, records[7].model_dump(mode="json"), (1, 70))  # live, with room again: kept
    replay.advance()
    assert replay.left_out == LeftOut(4, (1, 40))
    assert replay.next_lsn == 4 and replay.buffered == 1  # 7 is held, above the 4 left out...
    assert replay.needs_rescan  # ...so only reading again from (1, 40) brings 4 and 5
    replay.rescanned()
    for lsn, read_at in ((5, (1, 50)), (4, (1, 40))):
        replay.offer(lsn, records[lsn].model_dump(mode="json"), read_at)
    replay.advance()
    assert replay.next_lsn == 6 and replay.left_out is None
