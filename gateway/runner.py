"""The gateway's lifecycle: one runner starts the subsystems in order and stops them in reverse
(gateway/daemon.py runs it as a process).

Start (refused, exit 2, when the config file enables ``[camera]`` or ``[training]`` and this install
lacks its extra: gateway/extras.py): lock the data dir, open the log, load the control plane's
desired config and apply it (which starts the camera runner when ``[camera]`` is configured and
enabled, and the training runner when training is enabled), status HTTP, uplink, heartbeat, MQTT,
placement, the control plane's MQTT connection, sensor ingest last; then READY=1.
Stop (SIGTERM/SIGINT, or a fatal log error): STOPPING=1, stop intake (nothing more is taken from the
broker), flush the log and ack what is durable, stop the control plane and placement, publish
"offline" and disconnect, stop the heartbeat, the uplink, HTTP, training (a round in progress ends
at its next step) and the camera (its last events are logged), close the log, unlock; each step
within its share of STOP_STEPS_S (runtime/shutdown.py). SIGHUP: reload the config file (refused
whole if invalid; the old one stays).

Invariant: at most one daemon uses a data dir (flock), and a stop never acknowledges a message
whose record is not durable; it finishes within STOP_STEPS_S (True) or names what hung (False).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.control.handlers import (
    CameraHandler,
    GatewayHandler,
    HandlerSet,
    ModelsHandler,
    PlacementHandler,
    SensorHandler,
    ServiceHandler,
    TrainingHandler,
)
from gateway.control.log_verify import log_verify_op
from gateway.control.plane import ControlPlane
from gateway.control.recent_log import RecentLog
from gateway.control.reports import GatewayReports
from gateway.control.store import ControlStore
from gateway.control.wiring import base_from_file, known_models, task_catalog
from gateway.datadir import DataDirLock, StartupError, open_record_log, record_log_dir
from gateway.extras import NeedsExtraHandler, extra_installed, missing_extras
from gateway.heartbeat import HeartbeatSender
from gateway.ingest.sensors import SensorIngest
from gateway.metrics import make_registry
from gateway.mqtt.adapter import MqttAdapter, Will, settings_from_config
from gateway.mqtt.types import MqttSettings
from gateway.placement.execution import ServiceSides
from gateway.placement.plan import Plan
from gateway.placement.runner import PlacementRunner, make_monitor
from gateway.provided_files import check_provided_files
from gateway.reload import applied_live, restart_needed_for
from gateway.runner_metrics import gateway_collector
from gateway.runner_status import gateway_status, heartbeat_fields
from gateway.status import StatusServer
from gateway.uplink.sender import Uplink, read_token
from protocol.config import GatewayConfig, load_gateway_config
from protocol.control import ControlError, Side
from protocol.derived import PlacedService
from protocol.errors import ProtocolError
from protocol.topics import placement_topic, status_topic
from runtime.shutdown import run_stop_steps

if TYPE_CHECKING:  # imported where they are built (_make_camera, _make_training): see there why
    from gateway.camera.runner import CameraRunner
    from gateway.federated.runner import TrainingRunner

log = logging.getLogger(__name__)

STOP_DEADLINE_S = 10.0  # SIGTERM to exit (docs/gateway.md, "Stopping"; deploy/systemd allows more)
STOP_STEPS_S = 8.0  # the subsystems' stop steps; the rest is for leftover tasks and the exit itself
CONTROL_STOP_S = 1.0  # the control connection's disconnect
MQTT_STOP_S = 2.0  # the data connection's "offline" and disconnect


def presence_payload(gateway_id: str, state: str, ts: float) -> bytes:
    """The retained status message; "offline" is also the last will."""
    return json.dumps({"v": 1, "state": state, "gateway": gateway_id, "ts": round(ts, 3)}).encode()


class GatewayRunner:
    def __init__(
        self, config: GatewayConfig, config_path: Path | None = None, recent: RecentLog | None = None
    ) -> None:
        self.config = config
        gw = config.gateway_id
        try:  # before anything is built: an invalid file starts nothing
            base = base_from_file(config)
        except ControlError as exc:
            raise StartupError(f"invalid config: {exc.detail}") from None
        refused = missing_extras(config)  # a section the file enables that this install cannot run
        if refused:
            raise StartupError("; ".join(refused))
        check_provided_files(config)  # the readers below would meet an unreadable file with a traceback
        self.started_at = time.monotonic()
        self._lock = DataDirLock(config.data_dir)
        self.config_path = config_path
        self.log = open_record_log(config)
        self._offline = Will(status_topic(gw), presence_payload(gw, "offline", time.time()))
        settings = settings_from_config(config.mqtt, gw, will=self._offline)
        online = Will(status_topic(gw), presence_payload(gw, "online", time.time()))
        self.mqtt = MqttAdapter(settings, on_connect_publish=[online])
        control_settings = settings_from_config(config.mqtt, gw, will=None, role="control")
        # The link monitor hears the uplink's real uploads and the prober's probes; the uplink retries
        # as soon as it says the link is back (docs/placement.md).
        self.link_monitor = make_monitor(config.placement)
        self.uplink = Uplink(
            self.log,
            gw,
            config.uplink,
            monitor=self.link_monitor,
        )
        self.link_monitor.add_listener(self.uplink.link_changed)
        self.placement = (
            PlacementRunner(
                config.placement, config.uplink.cloud_url, self.link_monitor, on_plan=self._on_plan
            )
            if config.placement.enabled
            else None
        )
        self.token = read_token(config.uplink.token, config.uplink.token_file)
        self.heartbeat = HeartbeatSender(
            gw,
            config.uplink.cloud_url,
            self.token,
            config.uplink.heartbeat_interval_s,
            lambda: heartbeat_fields(self),
        )
        self.fatal: asyncio.Future[BaseException] | None = None
        self.ingest = SensorIngest(
            self.mqtt,
            self.log,
            gw,
            config.devices.allow,
            config.log.flush_interval_ms,
            on_durable=self.uplink.wake,
            on_fatal=self._on_fatal,
            sensor_params=config.sensor.params(),
            sides=lambda: self._sides("sensor"),
        )
        self.recent = recent or RecentLog()
        self.handlers = HandlerSet()
        self.handlers.connect(
            "sensor", SensorHandler(lambda allow: self.ingest.set_allow(allow), self.mqtt.hold)
        )
        self.handlers.connect("gateway", GatewayHandler())
        self.handlers.connect("placement", PlacementHandler(self.set_placement_pins))
        with_camera = config.camera is not None and extra_installed("camera")
        self.camera = self._make_camera(control_settings) if with_camera else None
        if self.camera is not None:
            # frames for the cloud wait out of the log until the uplink sends (gateway/camera/handoff.py)
            self.uplink.add_before_batch(self.camera.events.release_held)
            if self.placement is not None:  # the plan uses what the camera measures (docs/placement.md)
                self.placement.add_measurement_source(self.camera.measurements)
            self.handlers.connect("camera", CameraHandler(self.camera.apply_camera, self.camera.health))
            self.handlers.connect("models", ModelsHandler(self.camera.apply_pins))
        elif config.camera is not None:  # [camera] (off) without its extra: enabling it says what is missing
            self.handlers.connect("camera", NeedsExtraHandler("camera"))
        self.training = self._make_training()
        training: ServiceHandler = TrainingHandler(self.training.apply, self.training.health)
        if not extra_installed("train"):  # training stays off: enabling it says what is missing
            training = NeedsExtraHandler("training", when_off=training)
        self.handlers.connect("training", training)
        store = ControlStore(config.data_dir / "control")
        self.control = ControlPlane(
            gw,
            MqttAdapter(control_settings),
            store,
            base,
            self.handlers,
            task_catalog(),
            known_models(config),
            GatewayReports(self.recent, self.status, self.ingest.devices),
        )
        self.control.ops["log.verify"] = log_verify_op(self.log.scrub)
        self.reloads = {"ok": 0, "failed": 0}
        self.last_reload: dict[str, Any] | None = None
        self.registry = make_registry(gateway_collector(self))
        self.link_monitor.register_metrics(self.registry)
        self.http = StatusServer(config.http.listen, self.status, self.registry)
        self._started: list[str] = []

    def _make_camera(self, control_settings: MqttSettings) -> CameraRunner:
        """The camera runner; imported here so that a gateway without a camera (or without the camera
        extra) never loads numpy, OpenCV or onnxruntime (and none loads torch)."""
        from gateway.camera.runner import CameraRunner

        config, camera = self.config, self.config.camera
        assert camera is not None
        # its own connection: retained model notices in, QoS 0 events out, never in the telemetry path
        settings = dataclasses.replace(
            control_settings,
            client_id=control_settings.client_id.replace("-control", "-camera"),
            inbound_bound=100,
        )
        return CameraRunner(
            camera,
            gateway_id=config.gateway_id,
            record_log=self.log,
            mqtt_settings=settings,
            cloud_url=config.uplink.cloud_url,
            token=self.token,
            store_dir=config.data_dir / "models",
            blob_spool=self.uplink.blobs.spool if self.uplink.blobs is not None else None,
            on_durable=self.uplink.wake,
            flush_interval_s=config.log.flush_interval_ms / 1000,
            on_fatal=self._on_fatal,
            sides=lambda: self._sides("camera"),
            report=self.handlers.report,
        )

    def _sides(self, service: PlacedService) -> ServiceSides:
        """Where the plan runs a service's tasks now; all at the edge when placement is off."""
        if self.placement is None:
            return ServiceSides.edge(service)
        current = self.placement.sides.current(service)
        if current.dispatch is not None and self.uplink.live_waits:  # a spilled input would wait too
            return dataclasses.replace(current, dispatch=current.dispatch.uplink_busy())
        return current

    def _make_training(self) -> TrainingRunner:
        """The training runner: cheap until enabled; torch loads only when a local round is to run."""
        from gateway.federated.runner import TrainingRunner

        config = self.config
        return TrainingRunner(
            config.training,
            gateway_id=config.gateway_id,
            data_dir=config.data_dir,
            cloud_url=config.uplink.cloud_url,
            token=self.token,
            uplink_log=self.log,
            link_view=lambda: self.link_monitor.snapshot().view(),
            wake_uplink=self.uplink.wake,
            report=lambda applied: self.handlers.report("training", applied),
        )

    def _offline_now(self) -> Will:
        gw = self.config.gateway_id
        return Will(status_topic(gw), presence_payload(gw, "offline", time.time()))

    def _on_fatal(self, exc: BaseException) -> None:
        if self.fatal is not None and not self.fatal.done():
            self.fatal.set_result(exc)

    async def start(self) -> None:
        self.fatal = asyncio.get_running_loop().create_future()
        self._lock.acquire()
        self._started.append("lock")
        await self.log.open()
        self._started.append("log")
        log.info(
            "log %s opened: log_id %s, durable lsn %d, trimmed lsn %d",
            record_log_dir(self.config),
            self.log.log_id,
            self.log.durable_lsn,
            self.log.trimmed_lsn,
        )
        if self.camera is not None:
            self._started.append("camera")  # started (or not) by the camera handler inside open()
        self._started.append("training")  # started (or not) by the training handler inside open()
        await self.control.open()  # the desired config applies before any intake starts
        try:
            await self.http.start()
        except OSError as exc:
            raise StartupError(f"http.listen {self.config.http.listen}: {exc.strerror}") from None
        self._started.append("http")
        services = (
            ("uplink", self.uplink),
            ("heartbeat", self.heartbeat),
            ("mqtt", self.mqtt),
            ("placement", self.placement),
            ("control", self.control),
            ("ingest", self.ingest),  # last: the first to stop
        )
        for name, service in services:
            if service is not None:  # placement is optional
                await service.start()
                self._started.append(name)
        log.info(
            "gatewayd started: broker %s, cloud %s, http %s",
            self.config.mqtt.broker,
            self.config.uplink.cloud_url,
            self.config.http.listen,
        )

    async def stop(self, deadline_s: float = STOP_STEPS_S) -> bool:
        """Stop in reverse order of start; True if everything stopped cleanly within the deadline.

        Intake stops first (it started last): from then on nothing more is taken from the broker.
        The uplink stops after ingest and MQTT, so a last upload may still finish.
        """
        steps: dict[str, Callable[[], Awaitable[object]]] = {
            "ingest": self.ingest.stop,
            "control": lambda: self.control.stop(timeout_s=CONTROL_STOP_S),
            "mqtt": lambda: self.mqtt.stop(final=self._offline_now(), timeout_s=MQTT_STOP_S),
            "uplink": self.uplink.stop,
            "heartbeat": self.heartbeat.stop,
            "placement": lambda: self.placement.stop() if self.placement else asyncio.sleep(0),
            "http": self.http.stop,
            "camera": lambda: self.camera.stop() if self.camera else asyncio.sleep(0),
            "training": self.training.stop,
            "log": self.log.close,
        }
        started = [name for name in reversed(self._started) if name != "lock"]
        failed = await run_stop_steps([(name, steps[name]) for name in started], deadline_s)
        if "lock" in self._started:
            self._lock.release()
        self._started.clear()
        return not failed

    async def reload(self) -> bool:
        """SIGHUP: read the config file again; an invalid one is refused whole and the old config stays."""
        path = self.config_path
        if path is None:
            log.warning("reload: no config file to reload")
            return False
        try:
            new = load_gateway_config(path)
            changed = await self.control.reload_base(base_from_file(new))
        except ProtocolError as exc:  # ControlError included: the file is refused whole
            detail = exc.detail
            self.reloads["failed"] += 1
            self.last_reload = {"ok": False, "ts": round(time.time(), 3), "error": detail}
            log.error("reload: %s refused, keeping the previous config: %s", path, detail)
            return False
        later = restart_needed_for(self.config, new)
        if later:
            log.warning(
                "reload: %s changed in %s; that takes effect at the next restart", ", ".join(later), path
            )
        self.config = applied_live(self.config, new)
        self.reloads["ok"] += 1
        self.last_reload = {
            "ok": True,
            "ts": round(time.time(), 3),
            "changed": changed,
            "restart_needed_for": later,
        }
        log.info("reload: %s applied (services changed: %s)", path, ", ".join(changed) or "none")
        return True

    async def _on_plan(self, plan: Plan) -> None:
        """Each new placement plan: log it with its reasons, publish it retained (when connected).
        The controller logs the one INFO line per plan; the whole plan with its reasons is DEBUG."""
        log.debug("placement %s", plan.to_text())
        self.training.poke()  # the link changed: upload raw or train locally may change with it
        if self.placement is None or not self.mqtt.connected:
            return  # /status has it; the next plan is published once connected
        payload = json.dumps(self.placement.status()).encode()
        try:
            await self.mqtt.publish(
                placement_topic(self.config.gateway_id), payload, qos=1, retain=True, wait=False
            )
        except Exception as exc:  # not connected after all: the plan is still in /status
            log.warning("placement: could not publish plan v%d: %s", plan.version, exc)

    def set_placement_pins(self, pins: dict[str, Side]) -> dict[str, Side] | None:
        """The control plane's whole placement pin set. Before placement starts this only stores them
        (its first plan uses them); after, the controller re-plans at once. None: placement is off.
        Raises PinError (a ValueError; nothing changed) for a set the planner refuses."""
        if self.placement is None:
            return None
        if pins != self.placement.planner.pins:
            self.placement.planner.set_pins(pins)
            self.placement.controller.poke()
            log.info("placement pins -> %s", pins or "none")
        return dict(self.placement.planner.pins)

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows (runner_status.py)."""
        return gateway_status(self)
