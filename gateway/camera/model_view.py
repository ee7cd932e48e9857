"""How the camera's model shows: ``scene@<version> (<stage>)`` in the camera and models services'
details (``gatewayctl services``), the models service's answer, and the heartbeat's ``models`` field
(the running version, its pin and stage, and its live figures: gateway/camera/figures.py).

Invariant: pure functions of the engine and the updater as they are now: every view (services,
/status, /metrics, the heartbeat) reads the same running version, pin and stage.
"""

from __future__ import annotations

from typing import Any

from gateway.camera.inference import InferenceEngine
from gateway.camera.ota import ModelUpdater
from gateway.control.handlers import Applied


def model_label(name: str, version: str | None, stage: str | None) -> str:
    return f"{name}@{version} ({stage or 'stage unknown'})"


def running_label(name: str, engine: InferenceEngine | None, updater: ModelUpdater | None) -> str:
    if engine is None or updater is None:
        return f"{name}@None (not running)"
    return model_label(name, engine.active_version, updater.stage)


def models_answer(
    name: str, want: str | None, engine: InferenceEngine, updater: ModelUpdater, note: str
) -> Applied:
    """The models service's state: applied once the pinned version runs (or, unpinned, whatever the
    assignment gives); the updater's note says what a person should know."""
    running = running_label(name, engine, updater)
    why = f" ({updater.note})" if updater.note else ""
    if want is None:
        return Applied(
            "running", True, f"{name}: following cloudd's assignment; running {running}{why}{note}"
        )
    if engine.active_version == want:
        return Applied("running", True, f"{name}: pinned to {want}, running {running}{note}")
    why = why or f" ({updater.counters.last_error or 'the updater has not fetched it yet'})"
    return Applied("pending", False, f"{name}: pinned to {want}, running {running}{why}{note}")


def heartbeat_models(
    name: str, engine: InferenceEngine | None, updater: ModelUpdater | None
) -> dict[str, Any]:
    """The heartbeat's ``models`` field (``protocol.fleet.ModelFigures`` per name); empty when off."""
    if engine is None or updater is None or engine.window is None:
        return {}
    return {name: {**engine.window.figures(), "pinned": updater.pinned, "stage": updater.stage}}
