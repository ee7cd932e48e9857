"""Fixtures only: real processes of one test, on free ports, stopped after it. The tools behind them
are in tests/harness/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.broker import Broker, SecureBroker, start_broker, start_secure_broker
from tests.harness.cloudd import Cloudd, start_cloudd


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
