"""Fixtures of the control tests (the tools behind them are in tests/harness/)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.broker import Broker
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.poll import wait_until


@pytest.fixture
def gatewayd(mosquitto: Broker, tmp_path: Path) -> Iterator[Gatewayd]:
    """A real gatewayd gw1 on the test's plain mosquitto, its control plane subscribed (a module may
    define its own, e.g. on the secure broker)."""
    config, http_port = write_config(tmp_path, mosquitto.url)
    gw = Gatewayd(config, http_port).wait_ready()
    wait_until(lambda: gw.status()["control"]["births"] >= 1, 20, "control plane subscribed")
    yield gw
    gw.kill()
