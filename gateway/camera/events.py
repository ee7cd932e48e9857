"""Camera events: the records the camera service writes, whichever side its tasks run on.

    InferenceEngine --consumer task--> frame JPEG -> BlobSpool (optional)
                                       CameraEvent (summarise here) or InferenceResult (summarise in
                                       the cloud) -> log -> flush -> durable -> on_durable()
                                       MQTT event, QoS 0, on edgefed/<gw>/events/<camera_id>
    router task (routing.py) ---------> PlacementMarker; FrameForCloud (its JPEG in the BlobSpool),
                                       held in the CloudHandoff until the uplink takes it (handoff.py)

Owner: the camera runner (gateway/camera/runner.py) builds one ``CameraEventRecorder`` for its whole
life, so its counters outlive a camera restart. Each run calls ``start`` with that run's engine and
MQTT adapter (the consumer task begins), and at its end stops the engine, then calls ``drain``: the
consumer logs what the engine finished, flushes, and returns. The router task of the run appends the
markers and the frames sent to the cloud through ``append_marker``, ``append_for_cloud``,
``flush_routed``, and waits with ``settle`` for the consumer before a switch; the uplink's task
appends the held frames for the cloud through ``release_held`` (``drain`` releases what is left).

The runner appends each model swap's record (``append_swap``: a ``ModelSwap`` body), durable at once.

Invariant: every inference result the consumer takes becomes exactly one event record appended to the
log (a ``CameraEvent`` when its frame's ``summarise`` runs here, an ``InferenceResult`` otherwise), or
is counted (``events_log_full``, ``events_log_failed``); its MQTT event is published or counted
(``events_not_published``), never queued: the log holds the truth, MQTT is a best-effort live view.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.camera.handoff import CloudHandoff, HeldFrame
from gateway.camera.inference import InferenceEngine
from gateway.mqtt.adapter import MqttAdapter, MqttError
from gateway.placement.execution import ServiceSides
from gateway.storage.interface import LogFailed, LogFull, RecordLog
from gateway.uplink.blobs import BlobRef, BlobSpool
from models.inference import Inferred
from models.summarise import summarise
from protocol.config import CameraConfig
from protocol.control import Side
from protocol.derived import FrameForCloud, InferenceResult, PlacementMarker
from protocol.events import ModelSwap
from protocol.records import event_record
from runtime.tasks import wait_event

log = logging.getLogger(__name__)

DURABLE_WAIT_S = 30.0
HELD_FOR_CLOUD = 16  # frames for the cloud held out of the log at most (handoff.py); ~1 MB each decoded


@dataclass(frozen=True)
class EdgeFrame:
    """What a frame inferred here carries through the engine: its JPEG, and where it is summarised."""

    jpeg: bytes | None
    summarise_at: Side


def result_body(result: Inferred, config: CameraConfig, blob: BlobRef | None) -> dict[str, Any]:
    """The record of one inference made here: summarised (a CameraEvent, with the frame it came from)
    or handed to the cloud's ``summarise`` (an InferenceResult)."""
    frame: EdgeFrame = result.item.payload
    ref = blob.to_body() if blob is not None else None
    if frame.summarise_at == "cloud":
        return InferenceResult(inference=result.event, camera=config.alert_params(), blob=ref).model_dump(
            mode="json", exclude_none=True
        )
    event = summarise(
        result.event,
        config.alert_params(),
        infer_at="edge",
        summarise_at="edge",
        frame={"seq": result.item.seq, "jpeg_bytes": len(frame.jpeg) if frame.jpeg else 0},
        blob=ref,
    )
    return event.model_dump(mode="json", exclude_none=True)


class CameraEventRecorder:
    def __init__(
        self,
        config: CameraConfig,
        *,
        topic: str,
        record_log: RecordLog,
        blob_spool: BlobSpool | None,
        on_durable: Callable[[], None],
        flush_interval_s: float,
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self.config = config
        self._topic = topic
        self._log = record_log
        self._spool = blob_spool if config.upload_frames else None
        self._on_durable, self._on_fatal = on_durable, on_fatal
        self._flush_interval_s = flush_interval_s
        self._adapter: MqttAdapter | None = None
        self._consumer: asyncio.Task[None] | None = None
        self._draining = False
        self._recording = False  # the consumer holds a result it has not logged yet
        self._progress = asyncio.Event()  # the consumer took a turn: ``settle`` looks again
        self._routed_unflushed = 0  # records the router appended since its last flush...
        self._routed_since = 0.0  # ...the first of them at this time.monotonic()
        self.applied: ServiceSides | None = None  # the sides of this run's last marker
        self.handoff = CloudHandoff(HELD_FOR_CLOUD, on_held=on_durable)  # on_durable wakes the uplink
        self.counters = {
            "events_logged": 0,
            "events_log_full": 0,
            "marker_log_full": 0,
            "events_log_failed": 0,
            "events_published": 0,
            "events_not_published": 0,
            "frames_spooled": 0,
            "frames_spool_full": 0,
            "frames_spool_failed": 0,
            "flushes": 0,
            "markers": 0,
            "frames_inferred_here": 0,
            "frames_for_cloud": 0,
            "frames_for_cloud_log_full": 0,
            "frames_cloud_fallback": 0,
            "frames_spilled": 0,
            "frames_kept_here": 0,
            "alerts": 0,
            "swaps_logged": 0,
            "swap_log_full": 0,
        }

    @property
    def can_upload_frames(self) -> bool:
        return self._spool is not None

    def start(self, engine: InferenceEngine, adapter: MqttAdapter) -> None:
        """Take ``engine``'s results from now on; publish their events through ``adapter``."""
        self._adapter = adapter
        self._draining = False
        self.applied = None  # every run begins with a start marker
        self._consumer = asyncio.create_task(self._consume(engine), name="camera-consumer")

    async def drain(self) -> None:
        """End the consumer once it has taken, logged and flushed all the (stopped) engine finished."""
        await self.release_held()  # the router has ended: what it held for the cloud goes into the log
        if self._consumer is None:
            return
        self._draining = True
        try:
            async with asyncio.timeout(DURABLE_WAIT_S):
                await self._consumer
        except TimeoutError:
            log.error("camera: the consumer did not finish within %.0fs", DURABLE_WAIT_S)
        self._consumer = None
        self._adapter = None

    async def _consume(self, engine: InferenceEngine) -> None:
        appended, last_flush = 0, time.monotonic()
        while True:
            # short waits only while records wait for their flush; idle, the consumer wakes twice a second
            result = await engine.next_result(self._flush_interval_s if appended else 0.5)
            if result is not None:
                appended += await self._record(result)
            due = result is None or time.monotonic() - last_flush >= self._flush_interval_s
            if appended and due:
                await self._flush()
                appended, last_flush = 0, time.monotonic()
            self._progress.set()
            if result is None and self._draining:
                return

    async def _record(self, result: Inferred) -> int:
        """Log and publish one result; 1 if a record was appended."""
        self._recording = True
        try:
            ref = await self._spool_frame(result.item.payload.jpeg)
            body = result_body(result, self.config, ref)
            appended = await self._append(body, "events")
            self.counters["frames_inferred_here"] += 1
            self.counters["alerts"] += appended and body.get("severity") == "alert"
            await self._publish(body)
            return appended
        finally:
            self._recording = False

    async def _append(self, body: dict[str, Any], what: str) -> int:
        """Append one event record; 1 if appended, 0 if the log refused it (counted under ``what``)."""
        try:
            await self._log.append(event_record(self.config.camera_id, time.time(), body))
        except LogFull:
            self.counters[f"{what}_log_full"] += 1
            return 0
        except LogFailed as exc:
            self.counters["events_log_failed"] += 1
            self._on_fatal(exc)
            return 0
        if what == "events":
            self.counters["events_logged"] += 1
        return 1

    async def append_swap(self, swap: ModelSwap) -> None:
        """The record of a model swap, durable before this returns (or counted)."""
        if await self._append(swap.model_dump(mode="json", by_alias=True), "swap"):
            self.counters["swaps_logged"] += 1
            await self._flush()

    # --- the router's side (routing.py) ----------------------------------------------------------

    async def settle(self, engine: InferenceEngine) -> None:
        """Return once every frame submitted to ``engine`` has its record appended (or was counted)."""
        while engine.pending() or engine.results_waiting() or self._recording:
            self._progress.clear()  # the consumer sets it at every turn of its loop
            if not await wait_event(self._progress, DURABLE_WAIT_S):
                log.error("camera: inference did not settle within %.0fs before a switch", DURABLE_WAIT_S)
                return

    async def append_marker(self, want: ServiceSides) -> bool:
        marker = PlacementMarker(
            service="camera",
            sides=dict(want.sides),
            plan=want.plan,
            reason="start" if self.applied is None else "plan",
            camera=self.config.alert_params(),
        )
        if not await self._append(marker.model_dump(mode="json"), "marker"):
            return False  # counted; the router tries again before its next frame
        self.applied = want
        self.counters["markers"] += 1
        self._routed(1)
        return True

    async def append_for_cloud(
        self, frame: Any, model: str, model_version: str, deadline: float = math.inf
    ) -> bool:
        """A frame whose ``infer`` runs in the cloud: its JPEG spooled, its FrameForCloud held for the
        uplink (handoff.py) until ``deadline`` at most. False when it cannot go (no JPEG, the spool
        full or failing): the caller infers it here."""
        ref = await self._spool_frame(frame.jpeg)
        if ref is None:
            return False
        body = FrameForCloud(
            source=frame.camera_id,
            seq=frame.seq,
            capture_ts=frame.capture_ts,
            model=model,
            model_version=model_version,
            camera=self.config.alert_params(),
            blob=ref.to_body(),
        )
        held = HeldFrame(frame, body.model_dump(mode="json"), deadline)
        await self.handoff.hold(held, self._append_held)
        return True  # held (then appended, or counted as lost to a full log), or reclaimed by the router

    async def _append_held(self, item: HeldFrame) -> None:
        if await self._append(item.body, "frames_for_cloud"):
            self.counters["frames_for_cloud"] += 1
            self._routed(1)

    async def release_held(self) -> None:
        """Append the frames held for the cloud and make them durable (the uplink calls this before
        it chooses a batch: the batch then carries them)."""
        if await self.handoff.release(self._append_held):
            self._routed_unflushed = 0  # the flush below covers everything appended so far
            await self._flush()

    def _routed(self, records: int) -> None:
        if not self._routed_unflushed:
            self._routed_since = time.monotonic()
        self._routed_unflushed += records

    async def flush_routed(self, *, idle: bool) -> None:
        """Flush what the router appended: when its source is idle, or once ``flush_interval_s``
        passed since the oldest of them (a camera that never pauses still gets its records up)."""
        if not self._routed_unflushed:
            return
        if idle or time.monotonic() - self._routed_since >= self._flush_interval_s:
            self._routed_unflushed = 0
            await self._flush()

    async def _spool_frame(self, jpeg: bytes | None) -> BlobRef | None:
        spool = self._spool
        if spool is None or not jpeg:
            return None
        limit = self.config.spool_max_frames

        def put() -> BlobRef | None:  # blocking: hashing, fsync
            if spool.pending() >= limit:
                return None
            return spool.put(jpeg, content_type="image/jpeg")

        try:
            ref = await asyncio.to_thread(put)
        except OSError as exc:
            self.counters["frames_spool_failed"] += 1
            log.warning("camera: cannot spool a frame: %s", exc)
            return None
        self.counters["frames_spooled" if ref is not None else "frames_spool_full"] += 1
        return ref

    async def _publish(self, body: dict[str, Any]) -> None:
        """QoS 0, never waited for (publish returns once paho took it). Not connected: counted, not queued."""
        adapter = self._adapter
        if adapter is None or not adapter.connected:
            self.counters["events_not_published"] += 1
            return
        try:
            await adapter.publish(self._topic, json.dumps(body).encode(), qos=0, retain=False, wait=False)
            self.counters["events_published"] += 1
        except MqttError:
            self.counters["events_not_published"] += 1

    async def _flush(self) -> None:
        try:
            epoch = await self._log.flush()
            async with asyncio.timeout(DURABLE_WAIT_S):
                await asyncio.shield(epoch.durable)
        except LogFailed as exc:
            self._on_fatal(exc)
            return
        except TimeoutError:
            log.warning("camera: events not durable after %.0fs (slow disk?)", DURABLE_WAIT_S)
            return
        self.counters["flushes"] += 1
        self._on_durable()
