"""Fixtures only: real processes of one test, on free ports, stopped after it. The tools behind them
are in tests/harness/."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.broker import Broker, SecureBroker, start_broker, start_secure_broker
from tests.harness.cloudd import Cloudd, start_cloudd
from tests.harness.postgres import Postgres, postgres_binaries, start_postgres


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Broker]:
    """A real Mosquitto broker of this test's own, on a free port."""
    broker = start_broker(tmp_path / "broker")
    yield broker
    broker.stop()


@pytest.fixture
def secure_broker(tmp_path: Path) -> Iterator[SecureBroker]:
    """Mosquitto as deploy/mosquitto/ configures it: TLS, passwords, the ACL (tests.harness.broker.USERS)."""
    broker = start_secure_broker(tmp_path)
    yield broker
    broker.stop()


@pytest.fixture
def cloudd(tmp_path: Path) -> Iterator[Cloudd]:
    """A real cloudd on a free port, gateways gw1..gw3 (``token_for``), operator token required."""
    server = start_cloudd(tmp_path / "cloudd")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Postgres]:
    """One real PostgreSQL cluster for the session (tests.harness.postgres: its own initdb, on a
    free port); skipped, with the reason, only where its binaries are missing."""
    reason = postgres_binaries()
    if reason is not None:
        pytest.skip(reason)
    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture
def postgresql_url(postgres_cluster: Postgres) -> str:
    """The URL of a new, empty database of this test's own."""
    return postgres_cluster.create_database(f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str | None:
    """Each backend of the metadata database: None (the data dir's SQLite file) or a PostgreSQL URL."""
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("postgresql_url"))
