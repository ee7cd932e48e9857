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

Dispatching each frame (docs/placement.md): with an ``InputDispatch`` beside the sides, a frame goes
where it is done sooner, its latency here being ``(queued + 1) x`` the engine's measured cost (or the
operator's declared one). The
plan puts ``infer`` at the edge but this frame would be later here than the cloud's predicted latency:
it is held for the cloud (``frames_spilled``). Every frame held for the cloud carries a deadline, when
the edge would have inferred it; one the uplink has not taken by then is taken back and inferred here
(the handoff's ``overdue``), and while the link is failing every held frame is, and a frame the plan
sends to the cloud is inferred here at once (``frames_kept_here``): a link that went into a black hole
keeps no frame it never carried waiting for the monitor to call it down.

Invariant: every frame the source delivers is routed exactly once to where it is processed: submitted
to the engine (whose own invariant accounts for it), or appended as one ``FrameForCloud`` record, or
counted (``frames_for_cloud_log_full``); a frame reclaimed or taken back overdue from the handoff was
never appended and is routed again, to the engine. A frame's record never precedes the marker in
force when it was last routed, nor follows the next one.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from gateway.camera.events import CameraEventRecorder, EdgeFrame
from gateway.camera.inference import InferenceEngine
from gateway.placement.execution import EDGE_SIDES, InputDispatch, ServiceSides, sides_text
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
        wait_s, dispatch = POLL_S, sides().dispatch
        if dispatch is not None:  # every deadline left is in the future: a wait, never a busy loop
            await _take_overdue(engine, events, dispatch.link_failing)
            wait_s = min(wait_s, events.handoff.next_deadline() - time.monotonic())
        frame = await source.get(wait_s)
        if frame is None:
            continue
        await _follow(engine, events, sides)  # the plan may have changed while waiting
        await _route_applied(frame, engine, events, sides().dispatch)  # read again: it follows the link
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
        await _route_applied(held.frame, engine, events, None)


async def _take_overdue(engine: InferenceEngine, events: CameraEventRecorder, link_failing: bool) -> None:
    """Infer here the held frames the uplink did not take before their deadline (all of them while
    the link is failing)."""
    for held in await events.handoff.take_overdue(math.inf if link_failing else time.monotonic()):
        _infer_here(held.frame, engine, "edge")


async def _route_applied(
    frame: Any, engine: InferenceEngine, events: CameraEventRecorder, dispatch: InputDispatch | None
) -> None:
    """Route ``frame`` by the sides of the last marker, and ``dispatch`` (None: by the sides only)."""
    applied = events.applied  # None only while no marker could be appended (a full log)
    if applied is None:
        dispatch = None
    await _route(frame, engine, events, applied.sides if applied else EDGE_SIDES["camera"], dispatch)


async def _route(
    frame: Any,
    engine: InferenceEngine,
    events: CameraEventRecorder,
    sides: dict[str, Side],
    dispatch: InputDispatch | None,
) -> None:
    cost_s = None if dispatch is None else dispatch.cost_s(engine.cost_per_input()[0])
    if dispatch is not None and cost_s is not None:  # module docstring, "Dispatching each frame"
        edge_s = (engine.pending() + 1) * cost_s
        deadline = time.monotonic() + edge_s
        if sides["infer"] == "cloud" and dispatch.link_failing:
            events.counters["frames_kept_here"] += 1
            _infer_here(frame, engine, "edge")
            return
        spill = sides["infer"] == "edge" and events.can_upload_frames and dispatch.spill(edge_s)
    else:
        deadline, spill = math.inf, False
    if sides["infer"] == "cloud" or spill:
        model = engine.active_artifact
        if model is not None and await events.append_for_cloud(frame, model.name, model.version, deadline):
            events.counters["frames_spilled"] += spill
            return
        events.counters["frames_cloud_fallback"] += 1
    _infer_here(frame, engine, sides["summarise"])


def _infer_here(frame: Any, engine: InferenceEngine, summarise_at: Side) -> None:
    engine.submit(
        InferenceInput(
            frame.camera_id, frame.seq, frame.capture_ts, frame.image, EdgeFrame(frame.jpeg, summarise_at)
        )
    )
