"""The cloud model registry's routes on a real aiohttp server, and the gateway's OTA client against
it (with issue 22's assignment route beside them: tests/harness/assignment.py): upload/list/download
round trip, the assignment followed (never the newest), notice over a real broker, pins (the factory
version offline, a missing one -> the factory model), a tampered model refused, the shadow's agreement."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import numpy as np
from aiohttp import web

from cloud.api.registry import setup_model_routes
from gateway.camera.inference import InferenceEngine, SwapOutcome
from gateway.camera.model_store import LocalModels
from gateway.camera.ota import ModelUpdater
from models.artifact import ModelArtifact, build_metadata, save_artifact, sha256_hex
from models.inference import InferenceInput
from protocol.events import ModelNotice, ModelSwap
from protocol.topics import model_notice_topic
from tests.harness.assignment import Assignments, assignment_route
from tests.harness.camera import SCENE_ARTIFACT, relabel, scene_artifact
from tests.harness.mqtt import client as mqtt_client
from tests.harness.mqtt import publish, subscribe
from tests.harness.poll import eventually
from tests.harness.processes import free_port

OPERATOR_TOKEN = "op-secret"


def refuse_upload(request: web.Request) -> web.Response | None:
    if request.headers.get("Authorization") != f"Bearer {OPERATOR_TOKEN}":
        return web.json_response({"error": "unauthorized", "detail": "operator token required"}, status=401)
    return None


async def serve_registry(data_dir: Path, assignments: Assignments | None = None) -> tuple[web.AppRunner, str]:
    app = web.Application()
    if assignments is not None:  # issue 22's route, as the test decides it (tests/harness/assignment.py);
        assignment_route(app, assignments)  # first: the metadata route would take "assignment" as a version
    setup_model_routes(app, data_dir, refuse_upload)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def upload(
    http: aiohttp.ClientSession, url: str, artifact: ModelArtifact, token: str = OPERATOR_TOKEN
) -> tuple[int, dict]:
    form = aiohttp.FormData()
    form.add_field("metadata", artifact.metadata.model_dump_json(), content_type="application/json")
    form.add_field(
        "onnx", artifact.onnx_bytes, content_type="application/octet-stream", filename="model.onnx"
    )
    async with http.post(
        f"{url}/v1/models/{artifact.name}", data=form, headers={"Authorization": f"Bearer {token}"}
    ) as response:
        return response.status, (await response.json() if response.content_type == "application/json" else {})


async def test_registry_routes_round_trip(tmp_path: Path) -> None:
    runner, url = await serve_registry(tmp_path)
    v1, v2 = scene_artifact("1"), scene_artifact("2")
    try:
        async with aiohttp.ClientSession() as http:
            assert (await upload(http, url, v1, token="wrong"))[0] == 401
            status, entry = await upload(http, url, v1)
            assert status == 201 and entry["seq"] == 1 and entry["sha256"] == v1.metadata.sha256
            assert (await upload(http, url, v1))[0] == 200  # the same upload again: idempotent
            assert (await upload(http, url, relabel(v1, "1", onnx_bytes=v1.onnx_bytes + b"\0")))[0] == 409
            assert (await upload(http, url, v2))[1]["seq"] == 2
            tampered_form = aiohttp.FormData()
            tampered_form.add_field("metadata", scene_artifact("3").metadata.model_dump_json())
            tampered_form.add_field("onnx", v1.onnx_bytes[:-1] + b"\0", filename="m.onnx")
            async with http.post(
                f"{url}/v1/models/scene",
                data=tampered_form,
                headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
            ) as response:
                assert response.status == 400 and (await response.json())["error"] == "hash_mismatch"
            async with http.get(f"{url}/v1/models") as response:
                listed = (await response.json())["models"]
            assert [(e["version"], e["seq"]) for e in listed] == [("1", 1), ("2", 2)]
            async with http.get(f"{url}/v1/models/scene/2") as response:
                assert (await response.json())["sha256"] == v2.metadata.sha256
            async with http.get(f"{url}/v1/models/scene/2/onnx") as response:
                body = await response.read()
                assert response.headers["X-Model-Sha256"] == sha256_hex(body) == v2.metadata.sha256
            async with http.get(f"{url}/v1/models/scene/9") as response:
                assert response.status == 404
    finally:
        await runner.cleanup()


def reversed_labels(artifact: ModelArtifact, version: str) -> ModelArtifact:
    """The same network under other label names: it disagrees with ``artifact`` on most frames."""
    fields = artifact.metadata.model_dump(exclude={"sha256", "size", "version", "labels"})
    labels = list(reversed(artifact.metadata.labels))
    metadata = build_metadata(artifact.onnx_bytes, **fields, version=version, labels=labels)
    return ModelArtifact(metadata, artifact.onnx_bytes)


async def test_ota_follows_the_assignment_pins_and_falls_back_to_the_factory(
    tmp_path: Path, mosquitto
) -> None:
    """No newest: the updater runs the assignment (none: it keeps what runs), a pin overrides it,
    the factory version is pinnable with the registry gone, a pin that cannot be had runs the factory
    model and says so, tampered bytes are refused; each swap is reported with from, to, reason, stage."""
    assignments = Assignments()
    runner, url = await serve_registry(tmp_path / "cloud", assignments)
    engine = InferenceEngine()
    swaps: list[ModelSwap] = []

    async def on_swap(swap: ModelSwap) -> None:
        swaps.append(swap)

    local = LocalModels(tmp_path / "gw-models", "scene", SCENE_ARTIFACT)
    updater = ModelUpdater(
        engine, local, gateway_id="gw1", cloud_url=url, on_swap=on_swap, poll_interval_s=3600
    )  # only notices and explicit checks in this test
    loop = asyncio.get_running_loop()
    subscriber = mqtt_client()
    subscriber.on_message = lambda _c, _u, msg: loop.call_soon_threadsafe(updater.on_notice, msg.payload)
    try:
        async with aiohttp.ClientSession() as http:
            await updater.open()
            outcome, target = await updater.start_engine()  # nothing ran before: the factory model
            assert (outcome.ok, target.version, target.stage) == (True, "1", "factory")
            # no assignment (a cloudd without the route: 404): newer uploads are not followed
            v2 = scene_artifact("2")
            assert (await upload(http, url, v2))[0] == 201
            outcome = await updater.check()
            assert (outcome.ok, outcome.reason, engine.active_version) == (False, "no_assignment", "1")
            assert "no assignment from cloudd" in updater.note and "HTTP 404" in updater.note
            assert assignments.asked == ["gw1"]

            # assigned (canary), announced by a retained notice: the gateway swaps to it
            await updater.start()
            subscriber.connect(mosquitto.host, mosquitto.port)
            subscriber.loop_start()
            await asyncio.to_thread(subscribe, subscriber, model_notice_topic("gw1", "scene"))
            assignments.assign(v2, "canary", "canary set gw1")
            notice = ModelNotice(name="scene", version="2", sha256=v2.metadata.sha256, size=v2.metadata.size)
            message = notice.model_dump_json().encode()
            await asyncio.to_thread(
                publish, mosquitto.port, [(model_notice_topic("gw1", "scene"), message)], retain=True
            )
            await eventually(
                lambda: len(swaps) == 1, 10, "the updater swapping to version 2"
            )  # and reporting it
            assert engine.active_version == "2"
            assert (updater.stage, updater.note, updater.counters.notices) == ("canary", "", 1)
            assert swaps[-1].model_dump(by_alias=True, exclude={"ts"}) == {
                "v": 1, "type": "model_swap", "name": "scene", "from": "1", "to": "2",
                "reason": "assignment: canary set gw1", "stage": "canary",
            }  # fmt: skip

            # promoted: the same version, a new stage, no swap
            assignments.assign(v2, "production", "promoted")
            assert (await updater.check()).reason == "current" and updater.stage == "production"
            assert len(swaps) == 1

            # a pin overrides the assignment: the factory version, held locally
            assert (await updater.pin("1")).ok and engine.active_version == "1"
            assert (updater.stage, swaps[-1].reason) == ("pinned", "pin") and local.pinned() == "1"
            assert (await updater.pin(None)).ok and engine.active_version == "2"  # back to the assignment

            # version 4's bytes are damaged in the registry's store after upload: refused, 2 keeps running
            v4 = scene_artifact("4")
            assert (await upload(http, url, v4))[0] == 201
            onnx_file = tmp_path / "cloud" / "models" / "scene" / "4" / "model.onnx"
            onnx_file.write_bytes(onnx_file.read_bytes()[:-1] + b"\0")
            assignments.assign(v4, "canary")
            outcome = await updater.check()
            assert (outcome.ok, outcome.reason) == (False, "hash_mismatch")
            assert engine.active_version == "2" and updater.counters.refused == 1
            assert "assigned 4 cannot run" in updater.note
            assert (await updater.check()).reason == "refused_before"  # not fetched again

            # a pinned version the registry does not have: the factory model runs, and it says so
            outcome = await updater.pin("7")
            assert (outcome.ok, engine.active_version, updater.stage) == (False, "1", "factory")
            assert "pinned 7 is not available" in updater.note and updater.counters.factory_fallbacks == 1
            assert swaps[-1].reason.startswith("factory fallback: pinned 7") and swaps[-1].stage == "factory"
    except BaseException:
        await updater.stop()
        await engine.stop()
        raise
    finally:
        subscriber.loop_stop()
        subscriber.disconnect()
        await runner.cleanup()  # the registry is gone from here on
    try:
        # offline: the factory version and a version downloaded before are pinnable
        assert (await updater.pin("2")).ok and engine.active_version == "2"
        assert (await updater.pin("1")).ok and (engine.active_version, updater.stage) == ("1", "pinned")
        assert updater.note == ""
    finally:
        await updater.stop()
        await engine.stop()

    # a restart starts with the pin, offline: the engine never runs another version first
    async def restart() -> tuple[ModelUpdater, SwapOutcome]:
        engine = InferenceEngine()
        local = LocalModels(tmp_path / "gw-models", "scene", SCENE_ARTIFACT)
        updater = ModelUpdater(engine, local, gateway_id="gw1", cloud_url=url, on_swap=on_swap)
        await updater.open()
        try:
            outcome, _ = await updater.start_engine()
        finally:
            await updater.stop()
            await engine.stop()
        return updater, outcome

    again, outcome = await restart()
    assert (outcome.ok, outcome.version, again.stage, again.pinned) == (True, "1", "pinned", "1")
    # a pinned version held here whose bytes (hash right) no longer load: the factory model, and why
    save_artifact(tmp_path / "gw-models" / "scene" / "9", relabel(scene_artifact(), "9", b"not onnx" * 32))
    LocalModels(tmp_path / "gw-models", "scene", SCENE_ARTIFACT).set_pin("9")
    again, outcome = await restart()
    assert (outcome.ok, outcome.version, again.stage, again.pinned) == (True, "1", "factory", "9")
    assert "9 does not load (load_failed" in again.note and again.counters.factory_fallbacks == 1


async def test_shadow_agreement_after_a_swap() -> None:
    """After a swap the replaced version runs on every Nth frame: the same network agrees on all of
    them, one whose labels are renamed on few; the figures start again at each swap."""
    frames = [np.full((240, 320, 3), shade, np.uint8) for shade in (0, 60, 120, 200, 255)] * 4
    engine = InferenceEngine(shadow_s=600, shadow_every=2)
    assert (await engine.start(scene_artifact("1"))).ok
    try:

        async def infer_all() -> None:
            for seq, frame in enumerate(frames):
                engine.submit(InferenceInput("cam1", seq, 0.0, frame))
            for _ in frames:
                assert await engine.next_result(30) is not None
            await eventually(lambda: engine.pending() == 0, 30, "the engine idle")

        await infer_all()
        assert engine.window is not None and engine.window.figures()["shadow_frames"] == 0  # no shadow yet
        assert (await engine.swap(scene_artifact("2"))).ok
        await infer_all()
        await eventually(
            lambda: engine.window is not None and engine.window.shadow_frames == 10, 30, "shadowed"
        )
        same = engine.window.figures() if engine.window else {}
        assert (same["version"], same["frames"], same["shadow_agreement"]) == ("2", len(frames), 1.0)
        assert same["error_rate"] == 0.0 and 0 < same["confidence_mean"] <= 1 and same["latency_ms_p50"] > 0
        renamed = reversed_labels(scene_artifact(), "3")
        assert (await engine.swap(renamed)).ok and engine.shadow_version == "2"
        await infer_all()
        await eventually(
            lambda: engine.window is not None and engine.window.shadow_frames == 10, 30, "shadowed"
        )
        figures = engine.window.figures() if engine.window else {}
        assert figures["version"] == "3" and figures["shadow_agreement"] < 1.0, figures
    finally:
        await engine.stop()
