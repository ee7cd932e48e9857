"""Gateway configuration: the TOML file ``gatewayd --config`` reads (see deploy/gateway.example.toml).

Invariant: a configuration object exists only if it is valid; an invalid file or change is
rejected whole with a message naming the field (``load_gateway_config`` raises ProtocolError).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from protocol.errors import ProtocolError
from protocol.telemetry import describe_validation_error
from protocol.topics import ID_PATTERN


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
    protocol_version: Literal["5", "3.1.1"] = Field(
        default="5", description="MQTT v5 by default; 3.1.1 for brokers without v5 (e.g. the demo's amqtt)")
    keepalive_s: int = Field(default=30, ge=5, le=3600)
    inbound_queue: int = Field(default=10_000, ge=1)

    @field_validator("broker")
    @classmethod
    def _scheme(cls, value: str) -> str:
        if not value.startswith(("mqtt://", "mqtts://")):
            raise ValueError("must be mqtt://HOST:PORT or mqtts://HOST:PORT")
        return value


class DevicesConfig(_Section):
    allow: list[str] = Field(default_factory=lambda: ["*"], description="glob patterns of device ids")


class LogConfig(_Section):
    flush_interval_ms: int = Field(default=20, ge=1, le=10_000)
    segment_bytes: int = Field(default=64 * 1024 * 1024, ge=4096)
    max_bytes: int = Field(default=1024 * 1024 * 1024, ge=64 * 1024)
    full_policy: Literal["reject", "drop_oldest"] = "reject"


class UplinkConfig(_Section):
    cloud_url: str = "http://127.0.0.1:8700"
    token: str | None = None
    token_file: Path | None = None
    batch_max_records: int = Field(default=500, ge=1, le=10_000)
    batch_max_bytes: int = Field(default=1024 * 1024, ge=1024, le=8 * 1024 * 1024)
    timeout_s: float = Field(default=10.0, gt=0)
    backoff_initial_s: float = Field(default=0.2, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)


class HttpConfig(_Section):
    listen: str = "127.0.0.1:9100"


class GatewayConfig(_Section):
    gateway_id: str = Field(pattern=f"^{ID_PATTERN}$")
    data_dir: Path
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    mqtt: MqttConfig = Field(default_factory=MqttConfig)
    devices: DevicesConfig = Field(default_factory=DevicesConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    uplink: UplinkConfig = Field(default_factory=UplinkConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)


def parse_gateway_config(data: dict, base_dir: Path | None = None) -> GatewayConfig:
    """Validate a config mapping; relative paths are taken relative to ``base_dir``."""
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ProtocolError("invalid_config", describe_validation_error(exc)) from None
    if base_dir is not None and not config.data_dir.is_absolute():
        config = config.model_copy(update={"data_dir": base_dir / config.data_dir})
    return config


def load_gateway_config(path: Path) -> GatewayConfig:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ProtocolError("invalid_config", f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProtocolError("invalid_config", f"{path} is not valid TOML: {exc}") from None
    return parse_gateway_config(data, base_dir=path.parent)
