"""A placement trace played live on real processes, and what it left behind.

    devicesim sensors + a hot device --> mosquitto --> gatewayd --(uplink, probes)--> FaultProxy --> cloudd
    devicesim camera (MJPEG) ---------------------------^

The fault proxy plays the phases of a trace (a fast link, an outage, a slow link, a link flapping 2 s
up / 3 s down, a recovery); ``run_live`` records the phases' wall-clock bounds, the gateway's
``/status`` every ``SAMPLE_S`` (link state, plan version, sides, uplink), and every record cloudd
stores with the time an observer polling its store first saw it (``first_seen``) and the order it was
committed in (``order``). ``pins`` turn the plan into a static baseline (``{"camera/infer": "edge"}``).
The camera holds a still until ``SCENE_LEAD_S`` before the trace, then plays its scene from the start:
runs whose gateways took different times to start see the same frames in the same phases (the
changed frames come in bursts, and where a burst falls moved a phase's mean by seconds).
``weak_edge`` (tests/harness/weak_edge.py) makes the gateway a weak box: a heavier scene model, installed
in cloudd's registry so both sides infer with it, and gatewayd under a CPU quota from its start.

Used by tests/e2e/test_placement_live.py (what must hold) and bench/placement_live.py (how fast).
Invariant: every process and thread started here is stopped before ``run_live`` returns or raises.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud.store.dataset import DatasetStore, StoredRecord
from devices.sensors import SensorRun, SentRecord, run_sensors
from protocol.derived import derived_log_id
from protocol.topics import telemetry_topic
from tests.harness.broker import start_broker
from tests.harness.camera import DevicesimCamera
from tests.harness.cloudd import OPERATOR_TOKEN, cloudd_token, make_cloudd
from tests.harness.faultproxy import FaultProxy
from tests.harness.gatewayd import Gatewayd, telemetry, write_config
from tests.harness.mqtt import client as mqtt_client
from tests.harness.poll import wait_until
from tests.harness.processes import free_port
from tests.harness.weak_edge import WeakEdge, cpu_limit, install_in_registry

CAMERA_ID = "cam1"
SAMPLE_S = 0.5  # the gateway's /status and the cloud's store are read this often
HOT_DEVICE = "hot-001"  # publishes readings above the alert bound, always
HOT_C, ALERT_HIGH_C = 45.0, 40.0
READY_S = 20.0  # gatewayd's start, at full speed; on a weak edge it is given 1/fraction as long
# The camera's scene starts this long before the trace: the gateway has measured its frames (rate,
# changed fraction, size) and planned with them, as a gateway that has run with its camera has, and
# every run still meets the same scene in the same phase of the trace.
SCENE_LEAD_S = 15.0
SLOW = {"delay_s": 0.3, "bandwidth_Bps": 50_000}  # the slow link: 50 kB/s + 300 ms


@dataclass(frozen=True)
class Phase:
    """One named stretch of the trace, played as one or more fault proxy steps."""

    name: str
    steps: tuple[tuple[float, str, dict[str, Any]], ...]

    @property
    def duration_s(self) -> float:
        return sum(step[0] for step in self.steps)

    @staticmethod
    def steady(name: str, duration_s: float, kind: str, **params: Any) -> Phase:
        return Phase(name, ((duration_s, kind, params),))

    @staticmethod
    def flapping(duration_s: float, up_s: float = 2.0, down_s: float = 3.0) -> Phase:
        cycles = max(1, round(duration_s / (up_s + down_s)))
        return Phase("flapping", ((up_s, "up", {}), (down_s, "reset", {})) * cycles)


def trace(scale: float = 1.0) -> tuple[Phase, ...]:
    """Fast, outage, slow, flapping, recovery; ``scale`` stretches the steady phases only (the
    flapping keeps its 30 s of 2 s up / 3 s down: the detector is judged on its first 15 s)."""
    return (
        Phase.steady("fast", 40 * scale, "up"),
        Phase.steady("outage", 20 * scale, "blackhole"),
        Phase.steady("slow", 40 * scale, "slow", **SLOW),
        Phase.flapping(30),
        Phase.steady("recovery", 30 * scale, "up"),
    )


def gateway_config(
    camera_url: str,
    blob_dir: Path,
    pins: dict[str, str],
    artifact_dir: Path | None = None,
    dispatch_inputs: bool = True,
) -> str:
    """What gatewayd runs with (the part after write_config's [uplink] keys). ``dispatch_inputs``
    off: every frame goes where the plan runs ``infer`` (docs/placement.md, "Dispatching each frame").

    With ``artifact_dir`` (a weak edge's model) the gateway plans with what it measures, as a real box
    does. Without, it plans as a Raspberry-Pi-class box with the catalog's camera would: camera
    inference declared at 0.45 s, and nothing measured. The trace's expected sides (cloud on the fast
    link, the edge on the slow one) were worked out for that camera (1 fps, 10 % of frames changed,
    150 kB frames); measured, the devicesim camera (4 fps, ~25 % changed, ~7 kB JPEGs) sends so few
    bytes that the cost model prefers the cloud on the slow link too, while this machine infers the
    shipped model in ~1 ms."""
    pin_table = ", ".join(f'"{task}" = "{side}"' for task, side in pins.items())
    model = "" if artifact_dir is None else f'artifact_dir = "{artifact_dir}"\n'
    costs = "" if artifact_dir else 'measure_costs = false\n[placement.edge_costs]\n"camera/infer" = 0.45\n'
    return (
        f'blob_dir = "{blob_dir}"\n'
        "[log]\nflush_interval_ms = 50\n"
        '[devices]\nallow = ["sensor-*", "hot-*"]\n'
        f"[placement]\npins = {{ {pin_table} }}\n"  # the default probes: one every 5 s
        f"dispatch_inputs = {str(dispatch_inputs).lower()}\n"
        f"{costs}"
        f"[sensor]\nwindow_s = 1.0\n[sensor.bounds]\ntemperature_c = {{ high = {ALERT_HIGH_C} }}\n"
        f'[camera]\nenabled = true\ncamera_id = "{CAMERA_ID}"\nsource = "{camera_url}"\nalert_score = 0.9\n'
        "open_timeout_s = 3.0\nread_timeout_s = 3.0\nbackoff_initial_s = 0.2\nbackoff_max_s = 1.0\n"
        f"{model}"
    )


@dataclass
class LiveRun:
    """What one live trace left: phases, gateway samples, and the cloud's store as it filled."""

    phases: list[tuple[str, float, float]] = field(default_factory=list)  # name, start, end
    samples: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (time, /status)
    log_id: str = ""
    sensors: SentRecord = field(default_factory=SentRecord)
    hot_sent: int = 0
    records: list[StoredRecord] = field(default_factory=list)  # in commit order
    first_seen: dict[tuple[str, int], float] = field(default_factory=dict)  # (log_id, lsn) -> time
    final_status: dict[str, Any] = field(default_factory=dict)

    def phase(self, name: str) -> tuple[float, float]:
        return next((start, end) for n, start, end in self.phases if n == name)

    def gateway_log(self) -> list[StoredRecord]:
        return [r for r in self.records if r.log_id == self.log_id]

    def made_by_cloud(self, task: str) -> list[StoredRecord]:
        derived = derived_log_id(self.log_id, task)
        return [r for r in self.records if r.log_id == derived]

    def camera_results(self) -> list[StoredRecord]:
        """Every camera result: the events the gateway made (in its log) and those cloudd made."""
        bodies = [(r, r.record["body"]) for r in self.gateway_log()]
        at_edge = [r for r, body in bodies if "ran_at" in body and body.get("source") == CAMERA_ID]
        return at_edge + self.made_by_cloud("camera/summarise")

    def sensor_results(self, kind: str, task: str) -> list[StoredRecord]:
        """Every sensor result of one ``kind`` (``sensor_aggregate``, ``sensor_detection``): made by
        the gateway or by cloudd's ``task``."""
        at_edge = [r for r in self.gateway_log() if r.record["body"].get("type") == kind]
        return at_edge + self.made_by_cloud(task)

    def order(self) -> dict[tuple[str, int], int]:
        return {(r.log_id, r.lsn): i for i, r in enumerate(self.records)}

    def link_states(self) -> Iterator[tuple[float, str]]:
        for at, status in self.samples:
            yield at, status["placement"]["link"]["state"]


class _Observer(threading.Thread):
    """Follows cloudd's store (read-only, as its task runner does) and the gateway's /status."""

    def __init__(self, run: LiveRun, data_dir: Path, gateway: Gatewayd, gateway_id: str) -> None:
        super().__init__(name="live-observer", daemon=True)
        self.live, self.data_dir, self.gateway, self.gateway_id = run, data_dir, gateway, gateway_id
        self.stopping = threading.Event()
        self.errors: list[str] = []
        self._position = (0, 0)
        self._store: DatasetStore | None = None

    def poll(self) -> None:
        now = time.time()
        try:
            self.live.samples.append((now, self.gateway.status()))
        except OSError as exc:  # a status that did not answer in time is a gap in the samples
            self.errors.append(f"status: {exc}")
        if self._store is None and (self.data_dir / "meta.sqlite").exists():
            self._store = DatasetStore.open(self.data_dir, readonly=True)
        while self._store is not None:
            batch, self._position = self._store.read_from(self.gateway_id, self._position, 5000)
            for record in batch:
                self.live.first_seen.setdefault((record.log_id, record.lsn), now)
                self.live.records.append(record)
            if len(batch) < 5000:
                break

    def run(self) -> None:
        while not self.stopping.wait(SAMPLE_S):
            self.poll()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        self.poll()  # the last state, after everything drained


def _publish_hot(broker_port: int, stop: threading.Event, rate_hz: float, gateway_id: str = "gw1") -> int:
    """One device whose temperature is always above the alert bound; returns how many the broker took."""
    mqtt = mqtt_client(client_id=HOT_DEVICE)
    mqtt.connect("127.0.0.1", broker_port)
    mqtt.loop_start()
    infos = []
    try:
        seq = 0
        while not stop.wait(1.0 / rate_hz):
            body = telemetry(HOT_DEVICE, seq, ts=time.time(), readings={"temperature_c": HOT_C})
            infos.append(mqtt.publish(telemetry_topic(gateway_id, HOT_DEVICE), body, qos=1))
            seq += 1
        for info in infos:
            info.wait_for_publish(timeout=10)
        return sum(info.is_published() for info in infos)
    finally:
        mqtt.disconnect()
        mqtt.loop_stop()


def tasks_caught_up(status: dict[str, Any], log_id: str, logged: int) -> bool:
    """cloudd's task runner has stored every result it makes from the gateway log's first
    ``logged`` records and waits for no blob."""
    logs = [entry for entry in status["tasks"]["logs"] if entry["log_id"] == log_id]
    return bool(logs) and logs[0]["next_lsn"] > logged and logs[0]["waiting_blobs"] == 0


async def run_live(
    tmp: Path,
    phases: tuple[Phase, ...],
    *,
    pins: dict[str, str] | None = None,
    fps: float = 4.0,
    sensor_hz: float = 5.0,
    settle_timeout_s: float = 60.0,
    weak_edge: WeakEdge | None = None,
    dispatch_inputs: bool = True,
) -> LiveRun:
    """Play ``phases`` once on fresh processes under ``tmp``; drain; return what happened.
    ``weak_edge`` raises ``WeakEdgeUnavailable`` where no CPU quota can be set (not emulated);
    ``dispatch_inputs`` is gateway_config's."""
    tmp.mkdir(parents=True, exist_ok=True)
    run = LiveRun()
    stop_devices = threading.Event()
    with ExitStack() as cleanup:
        broker = start_broker(tmp / "broker")
        cleanup.callback(broker.stop)
        cloud = make_cloudd(tmp / "cloud", gateways=("gw1",), extra_args=["--tasks-poll-interval", "0.2"])
        cloud.start()
        cleanup.callback(cloud.stop)
        proxy = FaultProxy(cloud.port)
        proxy_port = await proxy.start()
        # held until SCENE_LEAD_S before the trace
        camera = DevicesimCamera(free_port(), tmp / "truth.jsonl", seed=5, fps=fps, hold=True)
        cleanup.callback(camera.stop)
        artifact_dir, model_version = None, None
        if weak_edge is not None:
            artifact_dir, artifact = await asyncio.to_thread(weak_edge.artifact, tmp / "weak-edge-model")
            await install_in_registry(cloud.url, OPERATOR_TOKEN, artifact)
            model_version = artifact.version
        config, http_port = write_config(
            tmp,
            broker.url,
            cloud_url=f"http://127.0.0.1:{proxy_port}",
            token=cloudd_token("gw1"),
            extra=gateway_config(camera.url, tmp / "blobs", pins or {}, artifact_dir, dispatch_inputs),
        )
        gateway = Gatewayd(config, http_port)
        cleanup.callback(gateway.terminate)  # registered first: run after the CPU quota is lifted
        ready_s = READY_S
        if weak_edge is not None:
            cleanup.enter_context(cpu_limit(gateway.proc.pid, weak_edge.cpu_fraction))
            ready_s = READY_S / min(1.0, weak_edge.cpu_fraction)
        await asyncio.to_thread(gateway.wait_ready, ready_s)
        if model_version is not None:  # the trace starts once the camera runs the heavy model
            await asyncio.to_thread(gateway.wait_status, _runs(model_version), ready_s, "the heavy model")
        run.log_id = gateway.status()["log"]["log_id"]

        sensors = SensorRun(
            broker=broker.url, count=3, rate_hz=sensor_hz, duration_s=None, dropout_probability=0.0
        )
        sent: list[SentRecord] = []
        hot: list[int] = []
        threads = [
            threading.Thread(target=lambda: sent.append(run_sensors(sensors, stop_devices))),
            threading.Thread(target=lambda: hot.append(_publish_hot(broker.port, stop_devices, sensor_hz))),
        ]
        observer = _Observer(run, cloud.data_dir, gateway, "gw1")
        try:
            for thread in threads:
                thread.start()
            observer.start()
            camera.play()
            await asyncio.sleep(SCENE_LEAD_S)
            start = time.time()
            steps = [step for phase in phases for step in phase.steps]
            await proxy.play(steps)
            for phase in phases:
                run.phases.append((phase.name, start, start + phase.duration_s))
                start += phase.duration_s
            await proxy.wait_trace(timeout=sum(p.duration_s for p in phases) + 30)
            stop_devices.set()
            for thread in threads:
                await asyncio.to_thread(thread.join, 30)
            camera.stop()
            await asyncio.to_thread(_settle, gateway, cloud, run.log_id, settle_timeout_s)
        finally:
            stop_devices.set()
            observer.stop()
            await proxy.stop()
        run.sensors, run.hot_sent = sent[0], hot[0]
        run.final_status = gateway.status()
        if model_version is not None and not _runs(model_version)(run.final_status):
            raise RuntimeError(
                f"the OTA updater swapped scene@{model_version} away: {run.final_status['camera']}"
            )
        if observer.errors:
            (tmp / "observer-errors.json").write_text(json.dumps(observer.errors))
    return run


def _runs(version: str) -> Any:
    """A /status check: the camera's inference engine has scene ``version`` loaded."""
    return lambda s: (s["camera"]["engine"] or {}).get("active_version") == version


def _settle(gateway: Gatewayd, cloud: Any, log_id: str, timeout_s: float) -> None:
    """Wait until the gateway has nothing left to send and cloudd has run every task on it."""
    gateway.wait_status(
        lambda s: s["camera"]["engine"]["pending"] == 0 and s["ingest"]["windows_open"] == 0,
        timeout_s,
        "the camera idle and every sensor window closed",
    )
    status = gateway.wait_status(lambda s: s["uplink"]["backlog"] == 0, timeout_s, "the uplink drained")
    logged = status["log"]["next_lsn"] - 1
    wait_until(lambda: cloud.count_records("gw1", log_id) >= logged, timeout_s, "every record in the cloud")
    wait_until(lambda: tasks_caught_up(cloud.status(), log_id, logged), timeout_s, "cloudd ran its tasks")
