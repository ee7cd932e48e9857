"""How a desired service config reaches the subsystem that runs the service: one handler per service.

A handler's ``apply(settings)`` makes the subsystem follow ``settings`` and says, honestly, what
happened: ``Applied(state, applied, detail)``. The runner connects the handlers it has; a service
without one gets ``UnconnectedHandler``, which applies nothing and says so (state ``pending``): the
desired config is stored, versioned and published, and takes effect once a handler is connected.
A service whose state changes later on its own (training: torch finished loading) says so with
``HandlerSet.report``; the control plane listens and publishes the new state. A handler's ``health()``
says what is wrong with the service *now* that its last answer does not (a camera whose capture is in
backoff is ``degraded``; a worker that died is ``failed``), or None; the control plane asks it
about twice a second and shows that over the answer while it lasts.

Invariant: neither ``apply`` nor ``health`` raises into the control plane (``HandlerSet`` turns an
exception into state ``failed`` with the error), and a handler is only ever given a validated settings
model.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from protocol.control import (
    SERVICE_NAMES,
    CameraSettings,
    GatewaySettings,
    ModelsSettings,
    PlacementSettings,
    SensorSettings,
    ServiceState,
    Side,
    TrainingSettings,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Applied:
    state: ServiceState
    applied: bool
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"state": self.state, "applied": self.applied, "detail": self.detail}


class ServiceHandler(Protocol):
    async def apply(self, settings: BaseModel) -> Applied: ...

    def health(self) -> Applied | None: ...


class _Handler:
    def health(self) -> Applied | None:
        """Nothing to add to the last ``apply``: the service runs as it answered."""
        return None


class UnconnectedHandler(_Handler):
    """For a service whose subsystem is not wired to the control plane in this gatewayd (yet)."""

    def __init__(self, service: str) -> None:
        self.service = service

    async def apply(self, settings: BaseModel) -> Applied:
        return Applied(
            "pending",
            False,
            f"stored as desired; no {self.service} handler is connected in "
            "this gatewayd, so it is not applied yet",
        )


class RunnerHandler:
    """A service that a runner object runs: its settings go, checked for their type, to its ``apply``;
    its ``health`` (if it has one) says how the running service is doing."""

    settings_type: type[BaseModel] = BaseModel

    def __init__(
        self,
        apply: Callable[[Any], Awaitable[Applied]],
        health: Callable[[], Applied | None] = lambda: None,
    ) -> None:
        self._apply = apply
        self.health = health

    async def apply(self, settings: BaseModel) -> Applied:
        assert isinstance(settings, self.settings_type)
        return await self._apply(settings)


class SensorHandler(_Handler):
    """sensor: ``allow`` goes to ingest; ``enabled=false`` holds the intake (the broker keeps messages)."""

    def __init__(self, set_allow: Callable[[Sequence[str]], None], hold: Callable[[bool], None]) -> None:
        self._set_allow = set_allow
        self._hold = hold

    async def apply(self, settings: BaseModel) -> Applied:
        assert isinstance(settings, SensorSettings)
        self._set_allow(list(settings.allow))
        self._hold(not settings.enabled)
        if settings.enabled:
            return Applied("running", True, f"accepting devices matching {list(settings.allow)}")
        return Applied("stopped", True, "intake held: telemetry waits at the broker (persistent session)")


class GatewayHandler(_Handler):
    """gateway: the log level of the whole daemon (the root logger)."""

    async def apply(self, settings: BaseModel) -> Applied:
        assert isinstance(settings, GatewaySettings)
        logging.getLogger().setLevel(settings.log_level)
        return Applied("running", True, f"log level {settings.log_level}")


class CameraHandler(RunnerHandler):
    """camera: on/off, source and sample rate go to the camera runner (gateway/camera/runner.py), which
    switches a source only after the old one's delivered frames were fed to the engine."""

    settings_type = CameraSettings


class ModelsHandler(RunnerHandler):
    """models: a pin (or its removal) goes to the model updater; applied only once the pinned version runs."""

    settings_type = ModelsSettings


class TrainingHandler(RunnerHandler):
    """training: on/off and the privacy flag go to the training runner (gateway/federated/runner.py),
    which decides "upload raw" or "train locally" from the link and the flag, and acts on it."""

    settings_type = TrainingSettings


class PlacementHandler(_Handler):
    """placement: the whole pin set replaces the planner's (validated whole) and it re-plans.

    ``set_pins`` returns the pins now in force, or None when placement is disabled; it raises
    ValueError (the planner's PinError) for a pin set it refuses, and then nothing changed."""

    def __init__(self, set_pins: Callable[[dict[str, Side]], dict[str, Side] | None]) -> None:
        self._set_pins = set_pins

    async def apply(self, settings: BaseModel) -> Applied:
        assert isinstance(settings, PlacementSettings)
        try:
            pins = self._set_pins(dict(settings.pins))
        except ValueError as exc:
            return Applied("failed", False, f"planner refused the pins: {exc}")
        if pins is None:
            return Applied("stopped", False, "placement is disabled (placement.enabled = false); pins stored")
        return Applied("running", True, f"planner pins {pins}" if pins else "no pins: the planner decides")


class HandlerSet:
    def __init__(self) -> None:
        self._handlers: dict[str, ServiceHandler] = {s: UnconnectedHandler(s) for s in SERVICE_NAMES}
        self._listener: Callable[[str, Applied], Awaitable[None]] | None = None

    def connect(self, service: str, handler: ServiceHandler) -> None:
        if service not in self._handlers:
            raise KeyError(f"unknown service {service!r}; known: {', '.join(SERVICE_NAMES)}")
        self._handlers[service] = handler

    def is_connected(self, service: str) -> bool:
        return not isinstance(self._handlers[service], UnconnectedHandler)

    async def apply(self, service: str, settings: BaseModel) -> Applied:
        try:
            return await self._handlers[service].apply(settings)
        except Exception as exc:  # a handler bug must not take the control plane down
            log.exception("control: applying %s failed", service)
            return Applied("failed", False, f"{type(exc).__name__}: {exc}")

    def health(self, service: str) -> Applied | None:
        """What is wrong with ``service`` now that its last answer does not say; None: nothing."""
        try:
            return self._handlers[service].health()
        except Exception as exc:  # a handler bug: the plane logs the state once, not every check
            return Applied("failed", False, f"health: {type(exc).__name__}: {exc}")

    def listen(self, listener: Callable[[str, Applied], Awaitable[None]]) -> None:
        """The control plane hears here of the states services reach on their own, after an ``apply``."""
        self._listener = listener

    async def report(self, service: str, applied: Applied) -> None:
        """``service`` is now in ``applied`` (no apply asked for it); nobody listening: nothing to do."""
        if self._listener is not None:
            await self._listener(service, applied)
