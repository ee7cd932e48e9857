"""Gateway configuration: the TOML file ``gatewayd --config`` reads (see deploy/gateway.example.toml).

Invariant: a configuration object exists only if it is valid; an invalid file or change is
rejected whole with a message naming the field (``load_gateway_config`` raises ProtocolError).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from protocol.control import LogLevel, Side
from protocol.derived import Bounds, CameraParams, SensorParams
from protocol.errors import ProtocolError
from protocol.federated import BUILTIN_ARCHS, FACTORY_PATTERN, CodecName
from protocol.telemetry import MAX_TELEMETRY_BYTES, describe_validation_error
from protocol.topics import ID_PATTERN

MqttVersion = Literal["5", "3.1.1"]
# The largest packet limit: MQTT's largest remaining length, the most paho announces as a Maximum
# Packet Size (a packet may have 5 bytes more of fixed header; no edgefed packet comes near).
MQTT_MAX_PACKET_BYTES = 268_435_455
# Room for what an edgefed packet carries besides its payload: fixed header, topic, packet id, MQTT 5
# properties. The least mqtt.max_packet_size may be still holds a largest telemetry payload on the
# longest telemetry topic (164 bytes more: fixed header 4, topic 2 + 155, packet id 2, properties 1).
PACKET_HEADROOM_BYTES = 1024
DEFAULT_MAX_PACKET_BYTES = MAX_TELEMETRY_BYTES + PACKET_HEADROOM_BYTES
MIN_MAX_PACKET_BYTES = MAX_TELEMETRY_BYTES + 256
# What a full log does (docs/storage.md, "Full log"): refuse new records (acked to the broker, lost);
# drop the oldest segment (the loss counted exactly, LogGap records tell the cloud); or hold: stop
# taking and acknowledging MQTT input until the uplink trims (the broker keeps it, within its limits).
FullPolicy = Literal["reject", "drop_oldest", "hold"]
DrainOrder = Literal["oldest", "newest"]
FlappingPolicy = Literal["edge", "model"]  # a flapping link: keep work at the edge, or trust the cost model


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MqttConfig(_Section):
    broker: str = "mqtt://127.0.0.1:1883"
    client_id: str | None = None
    username: str | None = None
    password_file: Path | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    protocol_version: MqttVersion = Field(
        default="5", description="MQTT v5 by default; 3.1.1 for brokers without v5 (e.g. the demo's amqtt)"
    )
    keepalive_s: int = Field(default=30, ge=5, le=3600)
    inbound_queue: int = Field(default=10_000, ge=1)
    max_packet_size: int = Field(
        default=DEFAULT_MAX_PACKET_BYTES,
        ge=MIN_MAX_PACKET_BYTES,
        le=MQTT_MAX_PACKET_BYTES,
        description="bytes; the largest MQTT packet the telemetry connection reads (docs/gateway.md)",
    )

    @field_validator("broker")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if not value.startswith(("mqtt://", "mqtts://")):
            raise ValueError("must be mqtt://HOST:PORT or mqtts://HOST:PORT")
        return value


class DevicesConfig(_Section):
    allow: list[str] = Field(default_factory=lambda: ["*"], description="glob patterns of device ids")


class SensorConfig(_Section):
    """The sensor service's ``aggregate`` and ``detect`` tasks (models/sensing.py; docs/gateway.md,
    "Sensor windows"): telemetry is cut into windows of ``window_s`` by receive time; a window whose
    mean of a reading leaves its ``bounds`` (or that holds a fault) is an alert. Takes effect at the
    next start; the placement marker carries them, so the cloud runs the tasks with the same."""

    window_s: float = Field(default=1.0, gt=0, le=3600)
    bounds: dict[str, Bounds] = Field(
        default_factory=dict, description="per reading, e.g. temperature_c = { low = -10, high = 45 }"
    )

    @field_validator("bounds")
    @classmethod
    def _ordered(cls, value: dict[str, Bounds]) -> dict[str, Bounds]:
        for name, bounds in value.items():
            if bounds.low is not None and bounds.high is not None and bounds.low >= bounds.high:
                raise ValueError(f"{name}: low ({bounds.low}) must be below high ({bounds.high})")
        return value

    def params(self) -> SensorParams:
        return SensorParams(window_s=self.window_s, bounds=dict(self.bounds))


class LogConfig(_Section):
    flush_interval_ms: int = Field(default=20, ge=1, le=10_000)
    segment_bytes: int = Field(default=64 * 1024 * 1024, ge=4096)
    max_bytes: int = Field(default=1024 * 1024 * 1024, ge=64 * 1024)
    full_policy: FullPolicy = "reject"
    # the background scrub (docs/storage.md, "Damage"): every record verified this often (0: only
    # when asked, gatewayctl log verify), reading at most scrub_rate_Bps
    scrub_interval_s: float = Field(default=86_400.0, ge=0)
    scrub_rate_Bps: int = Field(default=4 * 1024 * 1024, ge=64 * 1024)

    @model_validator(mode="after")
    def _budget_holds_two_segments(self) -> LogConfig:
        if self.max_bytes < 2 * self.segment_bytes:
            raise ValueError(
                f"max_bytes ({self.max_bytes}) must be at least twice segment_bytes ({self.segment_bytes})"
            )
        return self


class UplinkConfig(_Section):
    cloud_url: str = "http://127.0.0.1:8700"
    token: str | None = None
    token_file: Path | None = None
    batch_max_records: int = Field(default=500, ge=1, le=10_000)
    batch_max_bytes: int = Field(default=1024 * 1024, ge=1024, le=8 * 1024 * 1024)
    timeout_s: float = Field(default=10.0, gt=0)
    backoff_initial_s: float = Field(default=0.2, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)
    heartbeat_interval_s: float = Field(default=15.0, gt=0, le=3600, description="fleet heartbeat to cloudd")
    # Store-and-forward after an outage (docs/placement.md, "Uplink"): once more than
    # backlog_threshold_records wait, batches alternate between the live tail and the backlog, and the
    # backlog drains by class (alerts, then summaries, then raw), each oldest- or newest-first.
    backlog_threshold_records: int = Field(default=2000, ge=1)
    drain_alerts: DrainOrder = "newest"
    drain_summaries: DrainOrder = "newest"
    drain_raw: DrainOrder = "oldest"
    # backlog batches of summaries and raw data in flight at once (gateway/uplink/sender.py); 1 = one
    # request at a time
    in_flight_batches: int = Field(default=3, ge=1, le=16)
    bandwidth_cap_Bps: float | None = Field(default=None, gt=0, description="uplink cap; None = no cap")
    bandwidth_burst_bytes: int | None = Field(default=None, ge=1024)
    # gzip level of batch bodies (Content-Encoding: gzip; 0: sent as they are). The records' JSON
    # shrinks 4-8x at level 1 for well under a millisecond per batch; batch_max_bytes and cloudd's
    # body limit count the bytes before compression. Blobs (JPEG frames) go as they are.
    compress_level: int = Field(default=1, ge=0, le=9)
    # Resumable blob upload (gateway/uplink/blobs.py): blobs referenced by log records live in blob_dir
    # until the cloud committed them; None = this uplink uploads no blobs (their records go up alone).
    blob_dir: Path | None = None
    blob_chunk_bytes: int = Field(default=256 * 1024, ge=4096, le=8 * 1024 * 1024)
    # blobs in flight: their bytes in flight must cover the link's bandwidth x round trip (50 kB/s x 0.6 s
    # = 30 kB, about ten 3 kB frames) or the round trips, not the link, bound a drain
    blob_concurrency: int = Field(default=32, ge=1, le=64)


class PlacementConfig(_Section):
    """Link monitor, prober and placement planner (gateway/placement, docs/placement.md)."""

    enabled: bool = True
    probe_path: str = "/healthz"  # GET on uplink.cloud_url: the RTT probe
    goodput_path: str | None = "/v1/probe"  # POST payload_bytes there every goodput_every-th probe; "": none
    probe_interval_s: float = Field(default=5.0, gt=0)
    probe_timeout_s: float = Field(default=2.0, gt=0)
    goodput_every: int = Field(default=4, ge=1)
    payload_bytes: int = Field(default=32 * 1024, ge=1024, le=4 * 1024 * 1024)
    replan_interval_s: float = Field(default=1.0, gt=0)
    # LinkMonitor
    alpha: float = Field(default=0.3, gt=0, le=1)
    window_s: float = Field(default=30.0, gt=0)
    down_after_failures: int = Field(default=2, ge=1)
    flap_transitions: int = Field(default=4, ge=2)
    settle_factor: float = Field(default=1.5, gt=0)  # a steady stretch this x the longest ends "flapping"
    shift_ratio: float = Field(default=2.0, gt=1)  # two samples agreeing on a move this large jump the EWMA
    prior_goodput_Bps: float = Field(default=125_000.0, gt=0)
    confirm_after_s: float = Field(default=1.0, gt=0)  # a suspect failure is re-probed this much later
    # Budgets
    uplink_budget_Bps: float = Field(default=250_000.0, gt=0)
    edge_cores: float = Field(default=1.0, gt=0)
    edge_cpu_share: float = Field(default=0.8, gt=0, le=1)
    max_link_utilisation: float = Field(default=0.8, gt=0, le=1)
    flap_penalty_s: float = Field(default=5.0, ge=0)
    byte_weight: float = Field(default=1.0, ge=0)
    flapping: FlappingPolicy = "model"
    # a returning link settles this x its longest recent down stretch (0: never), at most
    # return_settle_max_s; meanwhile tasks in the cloud are priced with handing back the inputs of
    # handback_window_s to the edge if it drops again (docs/placement.md, cost model)
    return_settle_factor: float = Field(default=1.5, ge=0)
    return_settle_max_s: float = Field(default=15.0, ge=0)
    handback_window_s: float = Field(default=2.0, ge=0)
    # each camera frame goes where it is done sooner: the plan's side, unless the edge's queue would
    # make it later than the cloud, or the uplink has not taken it when the edge would have been done
    # (docs/placement.md, "Dispatching each frame"); a pinned task is never dispatched
    dispatch_inputs: bool = True
    # Hysteresis
    rtt_ratio: float = Field(default=1.5, gt=1)
    rtt_floor_s: float = Field(default=0.02, ge=0)
    goodput_ratio: float = Field(default=1.5, gt=1)
    up_fraction_delta: float = Field(default=0.2, gt=0, le=1)
    switch_gain: float = Field(default=0.05, ge=0)  # a move's least predicted gain, in latency targets
    pins: dict[str, Side] = Field(default_factory=dict, description='"service/task" -> side')
    decisions_in_status: int = Field(default=20, ge=1, le=256)
    # Costs (docs/placement.md, "Measured costs"): plan with what this box measures (the camera's
    # inference cost, frame rate, changed fraction and frame size), each value kept until a measurement
    # leaves [in force / cost_band_ratio, in force x cost_band_ratio]; an edge cost declared here is in
    # force whatever is measured (gatewayd checks that it names a task).
    measure_costs: bool = True
    cost_band_ratio: float = Field(default=1.5, gt=1)
    edge_costs: dict[str, float] = Field(
        default_factory=dict, description='"service/task" -> edge seconds per input, declared'
    )

    @field_validator("goodput_path")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None  # TOML has no null: "" turns the payload probes off

    @field_validator("edge_costs")
    @classmethod
    def _service_task_seconds(cls, value: dict[str, float]) -> dict[str, float]:
        for key, seconds in value.items():
            service, slash, task = key.partition("/")
            if not (service and slash and task):
                raise ValueError(f'{key!r}: must be "service/task"')
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"{key}: must be a number of seconds >= 0, not {seconds}")
        return value


class CameraConfig(_Section):
    """One camera, its change detection, its model and over-the-air updates (docs/camera.md).

    The section's presence connects the control plane's ``camera`` and ``models`` services; a gateway
    without it reports them ``pending``. ``enabled``, ``source`` and ``sample_fps`` are the defaults the
    control plane may override; the other fields take effect at the next start."""

    enabled: bool = False
    camera_id: str = Field(default="cam1", pattern=f"^{ID_PATTERN}$")
    source: str | None = Field(
        default=None, min_length=1, description="a file, an http(s)/rtsp(s) URL, or a device index"
    )
    sample_fps: float | None = Field(default=None, gt=0, le=120, description="None: every frame")
    queue_size: int = Field(default=32, ge=1, le=4096)  # frames between capture and inference, drop-oldest
    jpeg_quality: int = Field(default=80, ge=10, le=100)
    change_detection: bool = True  # False: every sampled frame is inferred and uploaded
    change_pixel_threshold: float = Field(default=18.0, gt=0, le=255)
    change_min_fraction: float = Field(default=0.004, ge=0, le=1)
    backoff_initial_s: float = Field(default=0.2, gt=0)
    backoff_max_s: float = Field(default=5.0, gt=0)
    open_timeout_s: float = Field(default=5.0, gt=0)
    read_timeout_s: float = Field(default=5.0, gt=0)
    model: str = Field(default="scene", pattern=f"^{ID_PATTERN}$")
    artifact_dir: Path | None = Field(default=None, description="None: models/artifacts/<model>")
    max_batch: int = Field(default=8, ge=1, le=256)
    inference_queue: int = Field(default=64, ge=1, le=4096)  # inputs waiting for the model, drop-oldest
    ota_poll_interval_s: float = Field(default=60.0, gt=0)
    ota_timeout_s: float = Field(default=10.0, gt=0)
    # after a swap the replaced version stays loaded this long as the shadow, run on every
    # shadow_every-th frame: the heartbeat's shadow_agreement (gateway/camera/figures.py); 0: no shadow
    shadow_s: float = Field(default=600.0, ge=0)
    shadow_every: int = Field(default=10, ge=1)
    upload_frames: bool = True  # spool changed frames' JPEGs in uplink.blob_dir (when set) and upload them
    spool_max_frames: int = Field(default=2000, ge=1)  # frames waiting in the spool; beyond: event only
    # A camera event is an alert (severity "alert", drained first) at or above alert_score, for the
    # labels in alert_labels (empty: any label); the cloud summarises with the same (the marker says).
    alert_score: float = Field(default=0.9, ge=0, le=1)
    alert_labels: list[str] = Field(default_factory=list)

    def alert_params(self) -> CameraParams:
        return CameraParams(alert_score=self.alert_score, alert_labels=list(self.alert_labels))

    @model_validator(mode="after")
    def _enabled_needs_source(self) -> CameraConfig:
        if self.enabled and self.source is None:
            raise ValueError("source is required when enabled = true")
        return self


class TrainingConfig(_Section):
    """Federated training on this gateway's own samples (gateway/federated, docs/federated.md).

    ``enabled`` and ``private`` are the defaults the control plane's ``training`` service may override;
    the other fields take effect at the next start. torch is imported only once local training runs."""

    enabled: bool = False
    private: bool = True  # raw data may not leave the gateway; false: upload raw when the link allows
    model: str = Field(default="digits", pattern=f"^{ID_PATTERN}$", description="the federated job's model")
    arch: str | None = Field(
        default=None,
        pattern=f"^({'|'.join(BUILTIN_ARCHS)})$|{FACTORY_PATTERN}",
        description="refuse a global model of another architecture; None: the job's",
    )
    data_source: Literal["samples"] = Field(
        default="samples", description="labelled TrainingSample records in <data_dir>/training/samples"
    )
    data_max_bytes: int = Field(default=64 * 1024 * 1024, ge=256 * 1024)  # private log budget, drop-oldest
    max_samples: int = Field(default=10_000, ge=1)  # the newest samples one round trains on
    min_samples: int = Field(default=16, ge=1)
    threads: int = Field(default=1, ge=1, le=64)  # torch intra-op threads
    duty: float = Field(default=0.5, gt=0, le=1)  # share of one core the trainer may use
    codec: CodecName = "bfp"
    mantissa_bits: int = Field(default=6, ge=2, le=8)
    block_size: int = Field(default=32, ge=1, le=4096)
    topk_fraction: float = Field(default=0.1, gt=0, le=1)
    error_feedback: bool = True
    poll_interval_s: float = Field(default=5.0, gt=0)
    retrain_after_s: float = Field(default=60.0, gt=0)
    timeout_s: float = Field(default=10.0, gt=0)
    # the raw-vs-local choice (gateway/federated/choice.py)
    raw_Bps: float | None = Field(
        default=None,
        gt=0,
        description="what raw samples would add to the "
        "uplink; None: the training service graph's declared rate",
    )
    max_link_share: float = Field(default=0.5, gt=0, le=1)
    min_up_fraction: float = Field(default=0.5, ge=0, le=1)
    decide_interval_s: float = Field(default=5.0, gt=0)
    forward_batch: int = Field(default=256, ge=1, le=10_000)  # raw mode: samples copied per uplink flush


def parse_listen(listen: str) -> tuple[str, int]:
    """``"127.0.0.1:9100"`` -> ("127.0.0.1", 9100); ``"[::1]:9100"`` works too, and ``":9100"`` is every
    interface. ValueError unless it is HOST:PORT with a port from 1 to 65535."""
    host, sep, port = listen.rpartition(":")
    if not (sep and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"{listen!r} must be HOST:PORT with a port from 1 to 65535")
    return host.strip("[]") or "0.0.0.0", int(port)


class HttpConfig(_Section):
    listen: str = "127.0.0.1:9100"

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        parse_listen(value)
        return value


class GatewayConfig(_Section):
    gateway_id: str = Field(pattern=f"^{ID_PATTERN}$")
    data_dir: Path
    log_level: LogLevel = "INFO"
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    devices: DevicesConfig = Field(default_factory=DevicesConfig)
    sensor: SensorConfig = Field(default_factory=SensorConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    uplink: UplinkConfig = Field(default_factory=UplinkConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    camera: CameraConfig | None = None  # absent: no camera service on this gateway
    training: TrainingConfig = Field(default_factory=TrainingConfig)  # absent: training off by default


def parse_gateway_config(data: dict, base_dir: Path | None = None) -> GatewayConfig:
    """Validate a config mapping. With ``base_dir`` (the config file's folder) relative paths are
    resolved, never against the process's working directory (``/`` under systemd): what the operator
    provides (``data_dir``, the credential files, the camera's artifact) against ``base_dir``, what
    the gateway writes (``uplink.blob_dir``) against ``data_dir``."""
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ProtocolError("invalid_config", describe_validation_error(exc)) from None
    if base_dir is None:
        return config
    data_dir = base_dir / config.data_dir  # an absolute data_dir stays as it is
    mqtt, uplink, camera = config.mqtt, config.uplink, config.camera
    inputs = ("password_file", "ca_file", "cert_file", "key_file")
    return config.model_copy(
        update={
            "data_dir": data_dir,
            "mqtt": mqtt.model_copy(update={k: _under(base_dir, getattr(mqtt, k)) for k in inputs}),
            "uplink": uplink.model_copy(
                update={
                    "token_file": _under(base_dir, uplink.token_file),
                    "blob_dir": _under(data_dir, uplink.blob_dir),
                }
            ),
            "camera": camera
            and camera.model_copy(update={"artifact_dir": _under(base_dir, camera.artifact_dir)}),
        }
    )


def _under(base: Path, path: Path | None) -> Path | None:
    return path if path is None or path.is_absolute() else base / path


def load_gateway_config(path: Path) -> GatewayConfig:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ProtocolError("invalid_config", f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProtocolError("invalid_config", f"{path} is not valid TOML: {exc}") from None
    return parse_gateway_config(data, base_dir=path.parent)
