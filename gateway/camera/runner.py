r"""The camera service inside gatewayd: one camera source, the inference engine, over-the-air model
updates, and the events they produce, started and stopped as one unit (docs/camera.md).

    CameraSource --router task--> InferenceEngine --consumer task--> log record (kind "event") + MQTT event
                             \--> FrameForCloud log record (infer placed in the cloud; routing.py)
    MQTT notice (edgefed/<gw>/models/<name>) --notice task--> ModelUpdater (+ polling) --swap--> engine

What the engine runs is the updater's decision (pin, cloudd's assignment, factory model:
gateway/camera/ota.py); at each swap this module writes the INFO line and the ``model_swap`` record and
reports the camera and models services' new details (``scene@<version> (<stage>)``: model_view.py).

This module is the lifecycle (start, stop, source switches, pins) and the numbers (``measurements()`` for
placement: gateway/camera/traffic.py; ``health()``: gateway/camera/health.py); what becomes of each result
(the consumer task: log, frame spool, MQTT event, flushes) is gateway/camera/events.py; where each frame goes
(the router task: the engine, or the cloud) is gateway/camera/routing.py.

Owner: the daemon builds one ``CameraRunner`` when its config has a ``[camera]`` section; the control
plane's camera and models handlers drive it (``apply_camera``, ``apply_pins``), and the daemon calls
``stop()`` before it closes the log. The runner owns its engine, source, updater, its own MQTT
connection (client id ``<client_id>-camera``, clean session: notices are retained, events are QoS 0)
and its three tasks (router, consumer, notices; the consumer through its ``CameraEventRecorder``); it
starts them in the order notices, consumer, router and stops them in reverse.

Invariants: every inference result becomes exactly one event record appended to the log, or is counted
(``events_log_full``, ``events_log_failed``: gateway/camera/events.py); a source change replaces the source
only after the old one's delivered frames were routed, so a switch loses no frame that was delivered; the
engine keeps ``submitted == inferred + dropped + failed + pending`` (gateway/camera/inference.py). The
module imports neither torch nor onnxruntime nor OpenCV: those load in threads, when a camera actually runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gateway.camera.events import CameraEventRecorder
from gateway.camera.health import camera_health
from gateway.camera.inference import InferenceEngine
from gateway.camera.model_store import LocalModels, default_artifact_dir
from gateway.camera.model_view import heartbeat_models, models_answer, running_label
from gateway.camera.ota import ModelUpdater
from gateway.camera.routing import route_frames
from gateway.camera.source import CameraSource, source_config
from gateway.camera.traffic import CameraTraffic, camera_quantities
from gateway.control.handlers import Applied
from gateway.mqtt.adapter import MqttAdapter, MqttSettings
from gateway.placement.execution import ServiceSides
from gateway.storage.interface import RecordLog
from gateway.taskgraphs.measured import Quantity
from gateway.uplink.blobs import BlobSpool
from models.artifact import ArtifactError
from protocol.config import CameraConfig
from protocol.control import CameraSettings, ModelsSettings, ServiceState
from protocol.events import ModelSwap
from protocol.topics import camera_events_topic, model_notice_topic
from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

STOP_FEED_S = 5.0  # the router task ends once the stopped source's queue is taken


def _numbers(values: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)}


class CameraRunner:
    def __init__(
        self,
        config: CameraConfig,
        *,
        gateway_id: str,
        record_log: RecordLog,
        mqtt_settings: MqttSettings,
        cloud_url: str,
        token: str | None,
        store_dir: Path,
        blob_spool: BlobSpool | None,
        on_durable: Callable[[], None],
        flush_interval_s: float,
        on_fatal: Callable[[BaseException], None],
        sides: Callable[[], ServiceSides] = lambda: ServiceSides.edge("camera"),
        report: Callable[[str, Applied], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self._sides = sides
        self._report = report  # the control plane hears of the states a swap brings
        self.gateway_id = gateway_id
        self._mqtt_settings = mqtt_settings
        self._cloud_url, self._token, self._store_dir = cloud_url, token, store_dir
        self.events = CameraEventRecorder(
            config,
            topic=camera_events_topic(gateway_id, config.camera_id),
            record_log=record_log,
            blob_spool=blob_spool,
            on_durable=on_durable,
            flush_interval_s=flush_interval_s,
            on_fatal=on_fatal,
        )
        self._lock = asyncio.Lock()  # one apply at a time: start, stop and source switches never interleave
        self.state: ServiceState = "stopped"
        self.detail = "not started"
        self._settings: CameraSettings | None = None
        self._pins: dict[str, str] | None = None  # None: not applied yet, so pin.json stands
        self.engine: InferenceEngine | None = None
        self.updater: ModelUpdater | None = None
        self.source: CameraSource | None = None
        self._traffic = CameraTraffic()  # the current source's; a new source starts a new one
        self._adapter: MqttAdapter | None = None
        self._router: asyncio.Task[int] | None = None
        self._notices: asyncio.Task[None] | None = None
        self._last: dict[str, Any] = {}  # the numbers of the last run, shown while stopped
        self.counters = {"source_switches": 0, "starts": 0, "start_failures": 0}

    # --- control plane ---------------------------------------------------------------------------

    async def apply_camera(self, settings: CameraSettings) -> Applied:
        """The camera service's desired config: on/off, source, sample rate."""
        async with self._lock:
            if not settings.enabled:
                await self._stop_all()
                self.state, self.detail = "stopped", "camera disabled"
                return Applied("stopped", True, self.detail)
            if settings.source is None:
                await self._stop_all()
                self.state, self.detail = "stopped", "enabled but no source is set (camera.source)"
                return Applied("pending", False, self.detail)
            if self.engine is None:
                try:
                    failure = await self._start_all(settings)
                except BaseException:
                    await self._stop_all()  # never half-started: undo what did start, then report
                    raise
                if failure is not None:
                    await self._stop_all()  # what did start (the updater's session) is closed
                    self.state, self.detail = "failed", failure
                    return Applied("failed", False, failure)
            elif self._settings is None or (
                (settings.source, settings.sample_fps) != (self._settings.source, self._settings.sample_fps)
            ):
                await self._switch_source(settings)
            self._settings = settings
            self.state, self.detail = "running", self._camera_detail()
            return Applied("running", True, self.detail)

    async def apply_pins(self, settings: ModelsSettings) -> Applied:
        """The models service: pin this camera's model, or follow cloudd's assignment for it."""
        async with self._lock:
            self._pins = dict(settings.pins)
            return await self._models_state(changed=True)

    async def _models_state(self, *, changed: bool) -> Applied:
        """The models service's answer; with ``changed``, the updater follows the desired pin first."""
        pins = self._pins or {}
        name = self.config.model
        want = pins.get(name)
        others = sorted(set(pins) - {name})
        note = f"; no model {', '.join(others)} on this gateway (ignored)" if others else ""
        if self.engine is None or self.updater is None:
            follows = f"pin {want}" if want else "following the assignment"
            return Applied(
                "stopped",
                False,
                f"stored; the camera is off, so {name} {follows} applies when it starts{note}",
            )
        if changed and want != self.updater.pinned:  # unchanged pins cost no request (e.g. at startup)
            await self.updater.pin(want)
        return models_answer(name, want, self.engine, self.updater, note)

    async def _swapped(self, swap: ModelSwap) -> None:
        """A swap (or rollback): an INFO line, its record in the log, the services' new details."""
        log.info(
            "models: %s swapped %s -> %s (stage %s): %s",
            swap.name,
            swap.from_version,
            swap.to,
            swap.stage,
            swap.reason,
        )
        await self.events.append_swap(swap)
        if self._report is None or self.engine is None:
            return
        if self.state == "running":
            self.detail = self._camera_detail()
            await self._report("camera", Applied("running", True, self.detail))
        await self._report("models", await self._models_state(changed=False))

    def _camera_detail(self) -> str:
        settings = self._settings
        source, fps = (settings.source, settings.sample_fps) if settings else (None, None)
        model = running_label(self.config.model, self.engine, self.updater)
        return f"camera {self.config.camera_id} reading {source} (sample_fps {fps or 'all'}); model {model}"

    # --- lifecycle -------------------------------------------------------------------------------

    async def stop(self) -> None:
        async with self._lock:
            await self._stop_all()
            self.state, self.detail = "stopped", "gatewayd stopping"

    async def _start_all(self, settings: CameraSettings) -> str | None:
        """Engine, updater, MQTT, source, tasks; the failure (everything undone) or None."""
        self.counters["starts"] += 1
        config = self.config
        folder = config.artifact_dir or default_artifact_dir(config.model)
        try:
            local = await asyncio.to_thread(LocalModels, self._store_dir, config.model, folder)
        except ArtifactError as exc:
            self.counters["start_failures"] += 1
            return f"model artifact {folder}: {exc}"
        engine = InferenceEngine(
            max_batch=config.max_batch,
            queue_size=config.inference_queue,
            shadow_s=config.shadow_s,
            shadow_every=config.shadow_every,
        )
        updater = ModelUpdater(
            engine,
            local,
            gateway_id=self.gateway_id,
            cloud_url=self._cloud_url,
            on_swap=self._swapped,
            token=self._token,
            poll_interval_s=config.ota_poll_interval_s,
            timeout_s=config.ota_timeout_s,
        )  # reads pin.json
        want = (self._pins or {}).get(config.model)
        if self._pins is not None and want != updater.pinned:  # the pin changed while the camera was off
            updater.pinned = want
            await asyncio.to_thread(local.set_pin, want)
        await updater.open()
        self.engine, self.updater = engine, updater  # _stop_all closes them if what follows fails
        try:
            outcome, target = await updater.start_engine()  # the pinned version, offline included
        except ArtifactError as exc:
            self.counters["start_failures"] += 1
            return f"model artifact {folder}: {exc}"
        if not outcome.ok:
            self.counters["start_failures"] += 1
            return f"model {config.model}@{outcome.version}: {outcome.reason}: {outcome.detail}"
        log.info(
            "models: %s starts with %s: %s",
            config.model,
            running_label(config.model, engine, updater),
            target.reason,
        )
        await updater.start()
        self._adapter = MqttAdapter(self._mqtt_settings)
        self._adapter.subscribe(model_notice_topic(self.gateway_id, self.config.model), qos=1)
        await self._adapter.start()
        self._notices = asyncio.create_task(self._notice_loop(), name="camera-notices")
        self.events.start(engine, self._adapter)
        await self._start_source(settings)
        log.info("camera %s: reading %s", config.camera_id, settings.source)
        return None

    async def _start_source(self, settings: CameraSettings) -> None:
        assert self.engine is not None
        self.source = CameraSource(source_config(self.config, settings))
        self._traffic = CameraTraffic()
        await self.source.start()
        self._router = asyncio.create_task(
            route_frames(self.source, self.engine, self.events, self._sides), name="camera-router"
        )

    async def _stop_source(self) -> None:
        if self.source is not None:
            await self.source.stop()
        if self._router is not None:
            try:  # the stopped source is finished once its queue is taken: the feed task returns
                async with asyncio.timeout(STOP_FEED_S):
                    await self._router
            except TimeoutError:
                log.error("camera: the router task did not finish within %.0fs", STOP_FEED_S)
            self._router = None

    async def _switch_source(self, settings: CameraSettings) -> None:
        """The new source replaces the old one after every frame the old one delivered was fed."""
        await self._stop_source()
        self.counters["source_switches"] += 1
        log.info(
            "camera %s: source -> %s (sample_fps %s)",
            self.config.camera_id,
            settings.source,
            settings.sample_fps,
        )
        await self._start_source(settings)

    async def _stop_all(self) -> None:
        """Reverse order of ``_start_all``; each step runs even if an earlier one failed."""
        await self._stop_source()
        if self.engine is not None:
            await self.engine.stop()  # finishes what was submitted (bounded)
        await self.events.drain()  # the consumer logs what the engine finished, flushes and returns
        await cancel_and_wait(self._notices)
        self._notices = None
        if self.updater is not None:
            await self.updater.stop()
        if self._adapter is not None:
            await self._adapter.stop(timeout_s=2.0)
            self._adapter = None
        if self.engine is not None:  # the last counters stay in /status until the next start
            self._last = self.status_parts()
        self._settings = None
        self.engine = self.updater = self.source = None

    # --- tasks -----------------------------------------------------------------------------------

    async def _notice_loop(self) -> None:
        assert self._adapter is not None
        topic = model_notice_topic(self.gateway_id, self.config.model)
        while True:
            message = await self._adapter.receive(timeout_s=1.0)
            if message is not None and message.topic == topic and self.updater is not None:
                self.updater.on_notice(message.payload)

    # --- numbers ---------------------------------------------------------------------------------

    def measurements(self) -> dict[Quantity, float]:
        """The camera graph's figures measured now (placement's measurement source); empty when off."""
        if self.engine is None or self.source is None:
            return {}
        self._traffic.observe(self.source.counters)
        return camera_quantities(self.engine.cost_per_input()[0], self._traffic.figures())

    def model_figures(self) -> dict[str, Any]:
        """The heartbeat's ``models``: the running version, pin, stage, live figures; empty when off."""
        return heartbeat_models(self.config.model, self.engine, self.updater)

    def health(self) -> Applied | None:  # what is wrong with the running camera now, or None
        return camera_health(self.config.camera_id, self.source, self._router)  # no source: not running

    def status_parts(self) -> dict[str, Any]:
        source, engine, updater = self.source, self.engine, self.updater
        return {
            "capture": None
            if source is None
            else {"state": source.state, "queued": source.queued(), **dataclasses.asdict(source.counters)},
            "engine": None
            if engine is None
            else {
                "active_version": engine.active_version,
                "shadow_version": engine.shadow_version,
                "pending": engine.pending(),
                **engine.cost_status(),
                **dataclasses.asdict(engine.counters),
            },
            "updater": None if updater is None else updater.status(),
            "models": self.model_figures(),
        }

    def _event_counters(self) -> dict[str, int]:
        handoff = self.events.handoff
        held = {f"frames_{k}_for_cloud": v for k, v in handoff.counters.items()}
        held["frames_waiting_for_uplink"] = handoff.waiting()
        return {**self.events.counters, **held, **self.counters}

    def status(self) -> dict[str, Any]:
        settings = self._settings
        parts = self.status_parts() if self.engine is not None else dict(self._last)
        problem = self.health()  # the state the control plane shows, capture trouble included
        return {
            "camera_id": self.config.camera_id,
            "state": problem.state if problem else self.state,
            "detail": problem.detail if problem else self.detail,
            "source": settings.source if settings else None,
            "sample_fps": settings.sample_fps if settings else None,
            "model": self.config.model,
            "sides": None if self.events.applied is None else self.events.applied.sides,
            **parts,
            "events": self._event_counters(),
            "mqtt": self._adapter.stats() if self._adapter is not None else None,
        }

    def metrics(self) -> dict[str, float]:
        """Flat numbers for /metrics (``edgefed_gateway_camera_<key>``)."""
        parts = self.status_parts() if self.engine is not None else dict(self._last)
        out = {"running": float(self.state == "running"), **_numbers(self._event_counters())}
        for prefix, values in (
            ("capture", parts.get("capture")),
            ("inference", parts.get("engine")),
            ("ota", parts.get("updater")),
            ("model", (parts.get("models") or {}).get(self.config.model)),
        ):
            out.update({f"{prefix}_{k}": v for k, v in _numbers(values or {}).items()})
        return out


MODEL_FIGURES = (
    "frames",
    "confidence_mean",
    "shadow_agreement",
    "shadow_frames",
    "error_rate",
    "latency_ms_p50",
    "since_ts",
)
METRIC_GAUGES = {
    "running",
    "capture_queued",
    "inference_pending",
    "inference_largest_batch",
    "frames_waiting_for_uplink",
    "inference_cost_s_per_input",
    "inference_cost_batches",
    # the running version's figures: a swap starts them again (gateway/camera/figures.py)
    *(f"model_{k}" for k in MODEL_FIGURES),
}
