"""cloudd's model notices (cloud/notify.py) against a real broker: a version stored in the registry is
announced, retained, to every gateway; a dead broker costs nothing but counters."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from cloud.notify import ModelNotifier, NotifyConfig
from cloud.registry import ModelRegistry
from protocol.events import parse_model_notice
from protocol.topics import model_notice_topic
from tests.harness.camera import scene_artifact
from tests.harness.mqtt import retained
from tests.harness.poll import eventually
from tests.harness.processes import free_port


async def test_stored_version_is_announced_retained_to_every_gateway(tmp_path: Path, mosquitto) -> None:
    registry = ModelRegistry(tmp_path / "models")
    notifier = ModelNotifier(NotifyConfig(mosquitto.url), lambda: ["gw1", "gw2"])
    registry.add_listener(notifier.notify)
    notifier.start()
    try:
        artifact = scene_artifact("7")
        assert (await registry.store(artifact))[0] == 201
        assert (await registry.store(artifact))[0] == 200  # the same version again: no second notice
        await eventually(
            lambda: notifier.counters["published"] >= 2, 10, "notices published to both gateways"
        )
    finally:
        await asyncio.to_thread(notifier.stop)
    assert notifier.counters["notices"] == 1 and notifier.counters["published"] == 2, notifier.stats()
    topics = [model_notice_topic(gw, "scene") for gw in ("gw1", "gw2")]
    got = await asyncio.to_thread(retained, mosquitto.port, topics)
    for topic in topics:
        notice = parse_model_notice(got[topic])
        assert (notice.version, notice.sha256) == ("7", artifact.metadata.sha256)


async def test_dead_broker_never_blocks_or_raises(tmp_path: Path) -> None:
    notifier = ModelNotifier(NotifyConfig(f"mqtt://127.0.0.1:{free_port()}"), lambda: ["gw1"])
    notifier.start()
    started = time.monotonic()
    notifier.notify(scene_artifact("8").metadata)  # returns at once: a bounded queue, no network
    assert time.monotonic() - started < 0.5
    try:
        await eventually(
            lambda: notifier.counters["held_for_reconnect"] + notifier.counters["published"] >= 1,
            5,
            "the notice held for a reconnect (or published)",
        )
    finally:
        await asyncio.to_thread(notifier.stop)
    assert notifier.counters["held_for_reconnect"] == 1 and notifier.stats()["connected"] == 0
