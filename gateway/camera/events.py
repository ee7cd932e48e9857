"""Camera events: what the camera service makes of each inference result.

    InferenceEngine --consumer task--> frame JPEG -> BlobSpool (optional)
                                       log record (kind "event") -> flush -> durable -> on_durable()
                                       MQTT event, QoS 0, on edgefed/<gw>/events/<camera_id>

Owner: the camera runner (gateway/camera/runner.py) builds one ``CameraEventRecorder`` for its whole
life, so its counters outlive a camera restart. Each run calls ``start`` with that run's engine and
MQTT adapter (the consumer task begins), and at its end stops the engine, then calls ``drain``: the
consumer logs what the engine finished, flushes, and returns.

Invariant: every inference result the consumer takes becomes exactly one event record appended to the
log, or is counted (``events_log_full``, ``events_log_failed``); its MQTT event is published or counted
(``events_not_published``), never queued: the log holds the truth, MQTT is a best-effort live view.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.camera.inference import InferenceEngine
from gateway.mqtt.adapter import MqttAdapter, MqttError
from gateway.storage.interface import LogFailed, LogFull, RecordLog
from gateway.uplink.blobs import BlobRef, BlobSpool, blob_record
from models.inference import Inferred
from protocol.config import CameraConfig
from protocol.records import Record, encode_record

log = logging.getLogger(__name__)

DURABLE_WAIT_S = 30.0


def event_body(result: Inferred) -> dict[str, Any]:
    """The InferenceEvent and which frame it came from (the JPEG itself travels as a blob)."""
    jpeg = result.item.payload
    return {
        **result.event.model_dump(mode="json"),
        "frame": {"seq": result.item.seq, "jpeg_bytes": len(jpeg) if jpeg else 0},
    }


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
        self.counters = {
            "events_logged": 0,
            "events_log_full": 0,
            "events_log_failed": 0,
            "events_published": 0,
            "events_not_published": 0,
            "frames_spooled": 0,
            "frames_spool_full": 0,
            "frames_spool_failed": 0,
            "flushes": 0,
        }

    def start(self, engine: InferenceEngine, adapter: MqttAdapter) -> None:
        """Take ``engine``'s results from now on; publish their events through ``adapter``."""
        self._adapter = adapter
        self._draining = False
        self._consumer = asyncio.create_task(self._consume(engine), name="camera-consumer")

    async def drain(self) -> None:
        """End the consumer once it has taken, logged and flushed all the (stopped) engine finished."""
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
            if result is None and self._draining:
                return

    async def _record(self, result: Inferred) -> int:
        """Log and publish one result; 1 if a record was appended."""
        body = event_body(result)
        camera_id, now = self.config.camera_id, time.time()
        ref = await self._spool_frame(result.item.payload)
        if ref is not None:
            record = blob_record(camera_id, now, ref, **body)
            body["blob"] = ref.to_body()
        else:
            record = encode_record(Record(kind="event", device=camera_id, received_ts=now, body=body))
        appended = 0
        try:
            await self._log.append(record)
            self.counters["events_logged"] += 1
            appended = 1
        except LogFull:
            self.counters["events_log_full"] += 1
        except LogFailed as exc:
            self.counters["events_log_failed"] += 1
            self._on_fatal(exc)
        await self._publish(body)
        return appended

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
