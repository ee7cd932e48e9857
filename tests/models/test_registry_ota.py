"""The cloud model registry's routes on a real aiohttp server, and the gateway's OTA client against
it: upload/list/download round trip, notice over a real broker, pin/unpin, a tampered model refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from aiohttp import web

from cloud.api.registry import setup_model_routes
from gateway.camera.inference import InferenceEngine
from gateway.camera.ota import ModelUpdater
from models.artifact import ModelArtifact, sha256_hex
from protocol.events import ModelNotice
from protocol.topics import model_notice_topic
from tests.harness.camera import relabel, scene_artifact
from tests.harness.mqtt import client as mqtt_client
from tests.harness.mqtt import publish, subscribe
from tests.harness.poll import eventually
from tests.harness.processes import free_port

OPERATOR_TOKEN = "op-secret"


def refuse_upload(request: web.Request) -> web.Response | None:
    if request.headers.get("Authorization") != f"Bearer {OPERATOR_TOKEN}":
        return web.json_response({"error": "unauthorized", "detail": "operator token required"}, status=401)
    return None


async def serve_registry(data_dir: Path) -> tuple[web.AppRunner, str]:
    app = web.Application()
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


async def test_ota_notice_pin_unpin_and_tampered_model(tmp_path: Path, mosquitto) -> None:
    runner, url = await serve_registry(tmp_path / "cloud")
    engine = InferenceEngine()
    updater = ModelUpdater(
        engine, name="scene", cloud_url=url, store_dir=tmp_path / "gw-models", poll_interval_s=3600
    )  # only notices and explicit checks in this test
    loop = asyncio.get_running_loop()
    subscriber = mqtt_client()
    subscriber.on_message = lambda _c, _u, msg: loop.call_soon_threadsafe(updater.on_notice, msg.payload)
    try:
        async with aiohttp.ClientSession() as http:
            assert (await upload(http, url, scene_artifact("1")))[0] == 201
            assert (await engine.start(scene_artifact("1"))).ok
            await updater.start()
            subscriber.connect(mosquitto.host, mosquitto.port)
            subscriber.loop_start()
            await asyncio.to_thread(subscribe, subscriber, model_notice_topic("gw1", "scene"))
            # a new version and its retained notice: the gateway swaps to it
            v2 = scene_artifact("2")
            assert (await upload(http, url, v2))[0] == 201
            notice = ModelNotice(name="scene", version="2", sha256=v2.metadata.sha256, size=v2.metadata.size)
            topic = model_notice_topic("gw1", "scene")
            message = notice.model_dump_json().encode()
            await asyncio.to_thread(publish, mosquitto.port, [(topic, message)], retain=True)
            await eventually(lambda: engine.active_version == "2", 10, "the updater swapping to version 2")
            assert updater.counters.notices >= 1
            # pin the old version; a newer upload does not move a pinned gateway; unpin does
            assert (await updater.pin("1")).ok and engine.active_version == "1"
            assert (await upload(http, url, scene_artifact("3")))[0] == 201
            assert (await updater.check()).reason == "pinned" or engine.active_version == "1"
            assert engine.active_version == "1"
            assert (await updater.unpin()).ok and engine.active_version == "3"
            # version 4's bytes are damaged in the registry's store after upload: refused, 3 keeps running
            assert (await upload(http, url, scene_artifact("4")))[0] == 201
            onnx_file = tmp_path / "cloud" / "models" / "scene" / "4" / "model.onnx"
            onnx_file.write_bytes(onnx_file.read_bytes()[:-1] + b"\0")
            outcome = await updater.check()
            assert (outcome.ok, outcome.reason) == (False, "hash_mismatch")
            assert engine.active_version == "3" and updater.counters.refused == 1
            assert (await updater.check()).reason == "refused_before"  # not fetched again
    finally:
        subscriber.loop_stop()
        subscriber.disconnect()
        await updater.stop()
        await engine.stop()
        await runner.cleanup()
