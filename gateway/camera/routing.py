"""The camera's frame router: each changed frame goes where the plan runs ``infer`` (docs/gateway.md,
"Camera tasks"), and a plan change switches the camera over between two frames.

    CameraSource --router task--> InferenceEngine (infer at the edge; tagged with where summarise runs)
                              \\-> the JPEG in the blob spool, its FrameForCloud held for the uplink
                                  (handoff.py; infer in the cloud)

Owner: the camera runner starts one router task per run (``route_frames``) and ends it by stopping
the source; the task returns once the stopped source's queue is taken.

Switching: before each frame the router reads the sides the plan gives the camera service. When they
differ from those in force (and at the start of every run), it first empties the cloud handoff: when
``infer`` stays in the cloud the held frames are appended (routed under the old sides, they precede
the marker); when it leaves, they are reclaimed and routed again after the marker, so a frame the link
never carried is inferred here rather than waiting out an outage. Then it waits until every frame
already routed to the engine has its record in the log (``CameraEventRecorder.settle``), and appends
the camera's ``PlacementMarker``; frames after the marker go where it says. Without a blob spool a
frame cannot reach the cloud, so ``infer`` stays at the edge whatever the plan says (the marker says
so too); a frame the full spool refuses is inferred here (``frames_cloud_fallback``), its record
saying so.

Invariant: every frame the source delivers is routed exactly once to where it is processed: submitted
to the engine (whose own invariant accounts for it), or appended as one ``FrameForCloud`` record, or
counted (``frames_for_cloud_log_full``); a frame reclaimed from the handoff was never appended and is
routed again. A frame's record never precedes the marker in force when it was last routed, nor
follows the next one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gateway.camera.events import CameraEventRecorder, EdgeFrame
from gateway.camera.inference import InferenceEngine
from gateway.placement.execution import EDGE_SIDES, ServiceSides, sides_text
from models.inference import InferenceInput
from protocol.control import Side

log = logging.getLogger(__name__)

POLL_S = 0.5  # how long the router waits for a frame before it looks at the plan again


def effective_sides(want: ServiceSides, can_upload_frames: bool) -> ServiceSides:
    """The plan's sides, with ``infer`` kept at the edge when frames cannot be sent."""
    if can_upload_frames or want.sides["infer"] == "edge":
        return want
    return ServiceSides(want.plan, {**want.sides, "infer": "edge"})


async def route_frames(
    source: Any,
    engine: InferenceEngine,
    events: CameraEventRecorder,
    sides: Callable[[], ServiceSides],
) -> int:
    """Route delivered frames until ``source`` (a CameraSource) is finished; returns the count."""
    routed = 0
    while not source.finished:
        await _follow(engine, events, sides)
        frame = await source.get(POLL_S)
        if frame is None:
            continue
        await _follow(engine, events, sides)  # the plan may have changed while waiting
        await _route_applied(frame, engine, events)
        routed += 1
        await events.flush_routed(idle=source.queued() == 0)  # the cloud's frames, durable soon
    return routed


async def _follow(
    engine: InferenceEngine, events: CameraEventRecorder, sides: Callable[[], ServiceSides]
) -> None:
    want = effective_sides(sides(), events.can_upload_frames)
    if events.applied is not None and want.sides == events.applied.sides:
        return
    reclaimed = []
    if want.sides["infer"] == "cloud":
        await events.release_held()  # routed under the old sides: their records go before the marker
    else:
        reclaimed = await events.handoff.reclaim()  # never sent: inferred here, after the marker
    await events.settle(engine)  # every frame routed under the old sides has its record first
    if await events.append_marker(want):
        log.info(
            "camera: tasks run %s from here (plan v%d)%s",
            sides_text(want.sides),
            want.plan,
            f"; {len(reclaimed)} frame(s) the link had not carried are inferred here" if reclaimed else "",
        )
    for held in reclaimed:
        await _route_applied(held.frame, engine, events)


async def _route_applied(frame: Any, engine: InferenceEngine, events: CameraEventRecorder) -> None:
    """Route ``frame`` by the sides of the last marker."""
    applied = events.applied  # None only while no marker could be appended (a full log)
    await _route(frame, engine, events, applied.sides if applied else EDGE_SIDES["camera"])


async def _route(
    frame: Any, engine: InferenceEngine, events: CameraEventRecorder, sides: dict[str, Side]
) -> None:
    if sides["infer"] == "cloud":
        model = engine.active_artifact
        if model is not None and await events.append_for_cloud(frame, model.name, model.version):
            return
        events.counters["frames_cloud_fallback"] += 1
    summarise_at: Side = sides["summarise"]
    engine.submit(
        InferenceInput(
            frame.camera_id, frame.seq, frame.capture_ts, frame.image, EdgeFrame(frame.jpeg, summarise_at)
        )
    )
