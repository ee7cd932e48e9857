"""CloudConfig: everything cloudd is started with, validated once at startup.

Invariant: a config that ``load_config`` returns is complete and consistent (every gateway id is
valid, every token non-empty); errors are ``ConfigError`` naming the flag or file and the field.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from cloud.jobs.scheduling import SchedulerSettings
from cloud.rollout.health import RolloutConfig
from cloud.rollout.verdict import GateConfig
from protocol.batch import MAX_BATCH_BYTES
from protocol.errors import ProtocolError
from protocol.topics import check_id


class ConfigError(ValueError):
    """An invalid cloudd option; the message names it."""


@dataclass(frozen=True)
class CloudConfig:
    data_dir: Path
    # the metadata database: a postgresql:// URL (replicas share it), None: <data_dir>/meta.sqlite
    database: str | None = None
    host: str = "127.0.0.1"
    port: int = 8700
    gateway_tokens: dict[str, str] = field(default_factory=dict)
    operator_token: str | None = None
    max_body_bytes: int = MAX_BATCH_BYTES
    max_pending_writes: int = 64
    shutdown_timeout: float = 10.0
    # training jobs (cloud/jobs): torchrun jobs at once, jobs waiting, processes per job
    max_running_jobs: int = 1
    max_queued_jobs: int = 16
    max_job_nproc: int = 4
    max_dataset_bytes: int = 512 * 1024 * 1024  # one uploaded dataset file (cloud.api.uploads)
    # how jobs are scheduled on which nodes (cloud.jobs.scheduling); None: the default, FIFO on one
    # node "local" with max_job_nproc devices
    scheduler: SchedulerSettings | None = None
    # the cloud's half of the placement plan (cloud/tasks): on/off, how often it reads the store
    tasks_enabled: bool = True
    tasks_poll_interval_s: float = 0.5
    # the model lifecycle (cloud/rollout): the quality gate and the canary controller
    gate: GateConfig = field(default_factory=GateConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


def parse_token_arg(arg: str) -> tuple[str, str]:
    """``GW=TOKEN`` -> (gw, token)."""
    gateway, sep, token = arg.partition("=")
    if not sep or not token:
        raise ConfigError(f"--token {arg!r}: expected GATEWAY=TOKEN")
    try:
        check_id("gateway", gateway)
    except ProtocolError as exc:
        raise ConfigError(f"--token {arg!r}: {exc.detail}") from None
    return gateway, token


def load_tokens_file(path: Path) -> dict[str, str]:
    """Read ``[gateways] gw1 = "token"`` from a TOML file."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--tokens-file {path}: {exc}") from None
    table = data.get("gateways")
    if not isinstance(table, dict):
        raise ConfigError(f"--tokens-file {path}: missing [gateways] table")
    tokens: dict[str, str] = {}
    for gateway, token in table.items():
        if not isinstance(token, str) or not token:
            raise ConfigError(f"--tokens-file {path}: gateways.{gateway} must be a non-empty string")
        try:
            check_id("gateway", gateway)
        except ProtocolError as exc:
            raise ConfigError(f"--tokens-file {path}: gateways.{gateway}: {exc.detail}") from None
        tokens[gateway] = token
    return tokens


def check_database_url(url: str, where: str) -> str:
    """A PostgreSQL URL as cloudd takes it (``where`` names the flag or field); ConfigError if not."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"{where}: {url!r} is not a postgresql://USER@HOST:PORT/DB URL")
    return url


def load_database_url(path: Path) -> str | None:
    """``[database] url = "postgresql://..."`` from the TOML file of ``--tokens-file`` (a password
    is better kept there than on a command line every ``ps`` shows); None when absent."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--tokens-file {path}: {exc}") from None
    table = data.get("database")
    if table is None:
        return None
    url = table.get("url") if isinstance(table, dict) else None
    if not isinstance(url, str):
        raise ConfigError(f"--tokens-file {path}: database.url must be a string")
    return check_database_url(url, f"--tokens-file {path}: database.url")
