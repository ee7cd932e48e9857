"""Dispatching each frame (docs/placement.md): the camera router sends a single frame against the plan
where it is done sooner, and every frame still lands on exactly one side.

A real inference engine (the shipped scene model, its measured cost pinned by its timer), a real
record log and blob spool, the real router and recorder; the frames come from a list, and the test
plays the uplink's part where one is needed (``release_held``, as the uplink calls it before a batch).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.camera.events import CameraEventRecorder
from gateway.camera.inference import InferenceEngine
from gateway.camera.routing import route_frames
from gateway.camera.source import CameraFrame
from gateway.placement.execution import InputDispatch, ServiceSides
from gateway.storage.epoch_log import EpochLog
from gateway.uplink.blobs import BlobSpool
from protocol.config import CameraConfig
from protocol.control import Side
from tests.harness.camera import scene_artifact, ticking
from tests.harness.poll import eventually

COST_S = 0.2  # what the engine measures per frame (its timer ticks this much per timed run)
FRAMES = 3


class ListSource:
    """The camera's frames, all delivered at once; finished once the test says so."""

    def __init__(self, frames: list[CameraFrame]) -> None:
        self._frames = deque(frames)
        self.finished = False

    async def get(self, within_s: float) -> CameraFrame | None:
        if self._frames:
            return self._frames.popleft()
        await asyncio.sleep(min(within_s, 0.01))
        return None

    def queued(self) -> int:
        return len(self._frames)


def frames() -> list[CameraFrame]:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)
    return [
        CameraFrame("cam1", seq, 1000.0 + seq, image, f"jpeg {seq}".encode(), 0.5) for seq in range(FRAMES)
    ]


class Camera:
    """The router and recorder of one camera run, over a real log."""

    def __init__(self, tmp: Path, sides: ServiceSides) -> None:
        self.log = EpochLog(tmp / "log", segment_bytes=1 << 20, max_bytes=8 << 20, writer_threads=1)
        self.engine = InferenceEngine(timer=ticking(COST_S))
        self.events = CameraEventRecorder(
            CameraConfig(enabled=True, source="list"),
            topic="edgefed/gw1/events/cam1",
            record_log=self.log,
            blob_spool=BlobSpool(tmp / "blobs"),
            on_durable=lambda: None,
            flush_interval_s=0.05,
            on_fatal=pytest.fail,
        )
        self.sides = sides
        self.source = ListSource(frames())

    async def run(self, until: Any) -> list[dict[str, Any]]:
        """Route every frame, until ``until()`` holds; the bodies logged, in order."""
        await self.log.open()
        assert (await self.engine.start(scene_artifact())).ok
        self.events.start(self.engine, None)  # type: ignore[arg-type]  # no MQTT: events counted unpublished
        router = asyncio.create_task(route_frames(self.source, self.engine, self.events, lambda: self.sides))
        try:
            await eventually(until, 10, "the frames routed and settled")
            self.source.finished = True
            assert await router == FRAMES
        finally:
            await self.engine.stop()
            await self.events.drain()
        bodies = [json.loads(data)["body"] async for _, data in self.log.read(1)]
        await self.log.close()
        return bodies

    def counter(self, name: str) -> int:
        """The recorder's counter ``name``, or its handoff's as ``handoff.<name>``."""
        if name.startswith("handoff."):
            return self.events.handoff.counters[name.removeprefix("handoff.")]
        return self.events.counters[name]


def sides(infer: Side, dispatch: InputDispatch | None) -> ServiceSides:
    return ServiceSides(1, {"infer": infer, "summarise": infer}, dispatch)


def where(bodies: list[dict[str, Any]]) -> Counter[str]:
    """Each frame's record: inferred here (a CameraEvent) or sent to the cloud (a FrameForCloud)."""
    seqs: Counter[str] = Counter()
    for body in bodies:
        if body.get("type") == "frame":
            seqs[f"cloud {body['seq']}"] += 1
        elif "ran_at" in body:
            assert body["ran_at"]["infer"] == "edge"
            seqs[f"edge {body['frame']['seq']}"] += 1
    return seqs


async def test_a_frame_the_edge_queue_would_delay_is_held_for_the_cloud_and_inferred_here_when_overdue(
    tmp_path: Path,
) -> None:
    """No uplink takes the spilled frames: past the time the edge would have taken, each comes back."""
    camera = Camera(tmp_path, sides("edge", InputDispatch(cloud_s=COST_S / 2)))
    bodies = await camera.run(lambda: camera.counter("frames_inferred_here") == FRAMES)
    assert camera.counter("frames_spilled") == FRAMES and camera.counter("handoff.overdue") == FRAMES
    assert where(bodies) == Counter(f"edge {seq}" for seq in range(FRAMES))  # once each, none sent


async def test_a_spilled_frame_the_uplink_takes_is_inferred_in_the_cloud_only(tmp_path: Path) -> None:
    camera = Camera(tmp_path, sides("edge", InputDispatch(cloud_s=COST_S / 2)))

    async def uplink() -> None:
        while True:
            await camera.events.release_held()
            await asyncio.sleep(0.01)

    taking = asyncio.create_task(uplink())
    try:
        bodies = await camera.run(lambda: camera.counter("frames_for_cloud") == FRAMES)
    finally:
        taking.cancel()
    assert camera.counter("frames_spilled") == FRAMES and camera.counter("handoff.overdue") == 0
    assert where(bodies) == Counter(f"cloud {seq}" for seq in range(FRAMES))


async def test_while_the_link_fails_a_frame_the_plan_sends_to_the_cloud_is_inferred_here(
    tmp_path: Path,
) -> None:
    camera = Camera(tmp_path, sides("cloud", InputDispatch(cloud_s=0.05, link_failing=True)))
    bodies = await camera.run(lambda: camera.counter("frames_inferred_here") == FRAMES)
    assert camera.counter("frames_kept_here") == FRAMES and camera.counter("handoff.held") == 0
    assert where(bodies) == Counter(f"edge {seq}" for seq in range(FRAMES))


async def test_without_dispatch_every_frame_goes_where_the_plan_says(tmp_path: Path) -> None:
    """A pinned ``infer`` (no ``InputDispatch``): a slow edge keeps its frames all the same."""
    camera = Camera(tmp_path, sides("edge", None))
    bodies = await camera.run(lambda: camera.counter("frames_inferred_here") == FRAMES)
    assert camera.counter("frames_spilled") == 0 and camera.counter("handoff.held") == 0
    assert where(bodies) == Counter(f"edge {seq}" for seq in range(FRAMES))
