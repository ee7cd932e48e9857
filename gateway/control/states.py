"""Each service's state as the control plane shows it: the answer to its last apply (or a state the
service reported on its own), overlaid by what its handler's ``health()`` says is wrong *now*: a
service whose worker is backing off is ``degraded``, one whose worker died is ``failed``, each with
the error, until it recovers and the answer shows again.

Owner: the control plane; its task calls ``check`` each time round (at least every 0.5 s) and
publishes the services it returns, and ``apply`` (or ``restart``: stop, then start with the same
settings) for each request that changes a service. Every change of state is logged: as a warning
(so also in ``log.errors``) when the service is degraded or failed, at most once per service per 10 s.

Invariant: every view (the retained ``state``, ``services.list``, ``/status``, the heartbeat) reads
``current``, so no two disagree; a report or health check taken while the service's apply runs is
older than that apply's answer and is dropped.
"""

from __future__ import annotations

import logging
from typing import Any

from gateway.control.handlers import Applied, HandlerSet
from gateway.ratelimit import RateLimitedLog
from protocol.control import SERVICE_NAMES, ControlError

log = logging.getLogger(__name__)

NOT_APPLIED = Applied("pending", False, "not applied yet")
UNHEALTHY = ("degraded", "failed")


class ServiceStates:
    def __init__(self, handlers: HandlerSet) -> None:
        self._handlers = handlers
        self._answers: dict[str, Applied] = {}  # each service's answer to its last apply, or its report
        self._problems: dict[str, Applied] = {}  # what is wrong with a service now, over that answer
        self._applying: set[str] = set()  # services whose apply runs: its answer is the newer state
        self._warn = RateLimitedLog(log)

    async def apply(self, service: str, settings: Any) -> None:
        self._applying.add(service)
        try:
            self._answers[service] = await self._handlers.apply(service, settings)
            # not what the old settings had; a problem that came during the apply (a capture that
            # failed at once) is logged here, as ``check`` logs one that comes later
            if self._set_problem(service, self._handlers.health(service)):
                self._log(service)
        finally:
            self._applying.discard(service)

    async def restart(self, service: str, settings: Any) -> None:
        """Apply ``settings`` (a running service's) disabled, then as they are: its subsystem stops and
        starts again. ControlError if the settings have it stopped: there is nothing to restart."""
        if not settings.enabled:
            raise ControlError(
                "conflict", f"{service} is stopped (enabled = false): start it", field="service"
            )
        await self.apply(service, settings.model_copy(update={"enabled": False}))
        await self.apply(service, settings)
        log.info("control: %s restarted: %s", service, self.current(service).state)

    def report(self, service: str, applied: Applied) -> bool:
        """``service`` reached ``applied`` on its own; True if that is news (logged; to publish)."""
        if service in self._applying or self._answers.get(service) == applied:
            return False
        self._answers[service] = applied
        self._log(service)
        return True

    def check(self) -> list[str]:
        """Ask each service how it is doing; the services whose state changed (logged; to publish)."""
        changed: list[str] = []
        for service in SERVICE_NAMES:
            if service not in self._applying and self._set_problem(service, self._handlers.health(service)):
                self._log(service)
                changed.append(service)
        return changed

    def current(self, service: str) -> Applied:
        """The state every view shows: what is wrong now, else the last answer."""
        return self._problems.get(service) or self._answers.get(service, NOT_APPLIED)

    def all(self) -> dict[str, Applied]:
        """Every service's current state (the heartbeat carries them)."""
        return {s: self.current(s) for s in SERVICE_NAMES}

    def unhealthy(self) -> dict[str, dict[str, object]]:
        """The services that are degraded or failed now, with why (``/status`` ``control.problems``)."""
        return {s: state.as_dict() for s, state in self.all().items() if state.state in UNHEALTHY}

    def _set_problem(self, service: str, problem: Applied | None) -> bool:
        if problem == self._problems.get(service):
            return False
        if problem is None:
            del self._problems[service]
        else:
            self._problems[service] = problem
        return True

    def _log(self, service: str) -> None:
        state = self.current(service)
        if state.state in UNHEALTHY:
            self._warn.warning(
                f"state:{service}", "control: %s is %s: %s", service, state.state, state.detail[:500]
            )
        else:
            log.info("control: %s is now %s: %s", service, state.state, state.detail)
