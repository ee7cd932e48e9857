"""The heartbeat's ``models`` field (issue 22) is optional on the wire: a gateway without a model
leaves it out, so a cloudd that predates the field (unknown fields refused) still accepts it; with
one, the body parses back to the same figures, and a figure out of range is refused naming the field."""

from __future__ import annotations

import json

import pytest

from gateway.heartbeat import HeartbeatSender
from protocol.errors import ProtocolError
from protocol.fleet import parse_heartbeat

FIGURES = {
    "version": "2",
    "pinned": None,
    "stage": "canary",
    "frames": 120,
    "confidence_mean": 0.93,
    "shadow_agreement": 0.98,
    "shadow_frames": 12,
    "error_rate": 0.0,
    "latency_ms_p50": 3.1,
    "since_ts": 1767225000.0,
}


def body(models: dict) -> bytes:
    sender = HeartbeatSender("gw1", "http://127.0.0.1:9", None, 1.0, lambda: {"models": models})
    return sender.body()


def test_no_models_leaves_the_field_out() -> None:
    assert "models" not in json.loads(body({}))
    assert parse_heartbeat(body({})).models is None


def test_models_round_trip_and_a_bad_figure_names_its_field() -> None:
    beat = parse_heartbeat(body({"scene": FIGURES}))
    assert beat.models is not None and beat.models["scene"].model_dump() == FIGURES
    raw = json.loads(body({"scene": FIGURES}))
    raw["models"]["scene"]["shadow_agreement"] = 1.5
    with pytest.raises(ProtocolError) as error:
        parse_heartbeat(json.dumps(raw).encode())
    assert "models.scene.shadow_agreement" in str(error.value)
