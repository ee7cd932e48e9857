"""ControlPlane: answers requests on ``edgefed/<gw>/control/request/<op>`` and publishes the desired
config and state of every service, retained, under ``edgefed/<gw>/services/<service>/``.

It owns its own MQTT connection (client id ``<id>-control``, clean session) and one task, which
takes requests one at a time: a request is parsed, checked against the current revision, applied
to a copy of the config (pure, gateway/control/ops.py), persisted (atomic file write), and only
then made current and handed to the service handlers. A restart (``service.restart``) hands a
running service its config disabled, then as it is, and keeps the revision; what the gateway
reports about itself (status, log lines, devices) comes from gateway/control/reports.py. Every
request is answered: on its MQTT v5 Response Topic with its Correlation Data, else on the
``response_topic``/``correlation_id`` of its payload (the MQTT 3.1.1 fallback), else on
``edgefed/<gw>/control/response/<op>`` (Zigbee2MQTT's convention). On each (re)connect the
retained service topics are published again (a birth), and a state a service reaches on its own
(``HandlerSet.report``) is published again when it comes, as is each change the task finds when it
asks every service how it is doing, at least every 0.5 s (``degraded`` or ``failed`` with the
error: gateway/control/states.py).

Invariant: a refused request changes nothing (config, revision, file) and is answered with an
error naming the field; an accepted change is on disk before it is current, answered, or applied.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from gateway.control.handlers import Applied, HandlerSet
from gateway.control.ops import (
    TaskCatalog,
    apply_change,
    changed_services,
    check_model_pins,
    check_placement_pins,
    digest,
    effective,
    overrides_after,
)
from gateway.control.reports import GatewayReports
from gateway.control.states import ServiceStates
from gateway.control.store import ControlStore
from gateway.mqtt.adapter import InboundMessage, MqttAdapter, MqttError
from gateway.ratelimit import RateLimitedLog
from protocol.control import (
    READ_ONLY_OPS,
    SERVICE_NAMES,
    ConfigGetRequest,
    ConfigSetRequest,
    ControlError,
    ControlResponse,
    DesiredConfig,
    ErrorBody,
    ResponseStatus,
    ServiceRestartRequest,
    StoredControl,
    parse_request,
    peek_reply_fields,
)
from protocol.topics import (
    control_op_of,
    control_request_subscription,
    control_response_prefix,
    is_control_response_topic,
    is_valid_id,
    service_topic,
)
from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

RESPONSE_EXPIRY_S = 60  # a response nobody collected within a minute is of no use to anyone


class ControlPlane:
    def __init__(
        self,
        gateway_id: str,
        adapter: MqttAdapter,
        store: ControlStore,
        base: DesiredConfig,
        handlers: HandlerSet,
        catalog: TaskCatalog,
        models: Collection[str],
        reports: GatewayReports,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.gateway_id = gateway_id
        self.adapter = adapter
        self._store = store
        self.base = base
        self.handlers = handlers
        self._catalog = catalog
        self._models = models  # the models this gateway runs: the only ones a pin may name
        self._reports = reports
        self._clock = clock
        self.config = base
        self.revision = 0
        self._overrides: dict[str, dict[str, Any]] = {}
        self._digest = digest(base)
        self._service_revision: dict[str, int] = dict.fromkeys(SERVICE_NAMES, 0)
        self.states = ServiceStates(handlers)
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._births_for = 0  # the adapter's connect count the retained topics were last published for
        self._warn = RateLimitedLog(log)
        self.counters = {
            "requests": 0,
            "ok": 0,
            "changes": 0,
            "births": 0,
            "internal_errors": 0,
            "publish_failures": 0,
        }
        self.refused: dict[str, int] = {}
        self.ops: dict[str, Callable[[Any], Awaitable[dict]]] = {}  # op -> answer (log_verify.py)
        handlers.listen(self.report)

    # --- lifecycle -------------------------------------------------------------------------------

    async def open(self) -> None:
        """Load the stored overrides over the base and apply every service once (before MQTT starts)."""
        stored = await asyncio.to_thread(self._store.load)
        if stored is not None:
            overrides: dict[str, dict[str, Any]] = {k: dict(v) for k, v in stored.overrides.items()}
            try:
                self.config = effective(self.base, overrides)
                check_placement_pins(self._catalog, self.config)
                self.revision, self._overrides = stored.revision, overrides
            except ControlError as exc:
                log.error(
                    "control: the stored config (revision %d) is no longer valid over the config "
                    "file (%s); using the config file alone",
                    stored.revision,
                    exc.detail,
                )
                self.revision = stored.revision  # revisions never go back: a stale writer stays stale
        self._digest = digest(self.config)
        self._service_revision = dict.fromkeys(SERVICE_NAMES, self.revision)
        for service in SERVICE_NAMES:
            await self.states.apply(service, getattr(self.config, service))
        log.info(
            "control: config revision %d (%d services overridden over MQTT)",
            self.revision,
            len(self._overrides),
        )

    async def start(self) -> None:
        self.adapter.subscribe(control_request_subscription(self.gateway_id), qos=1, retain_as_published=True)
        await self.adapter.start()
        self._task = asyncio.create_task(self._loop(), name="control-plane")

    async def stop(self, timeout_s: float = 3.0) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self.adapter.stop(timeout_s=timeout_s)

    async def _loop(self) -> None:
        while True:
            if self.adapter.connected and self.adapter.counters.connects != self._births_for:
                self._births_for = self.adapter.counters.connects
                await self._publish_birth()
            for service in self.states.check():
                await self._publish_news(service)
            message = await self.adapter.receive(timeout_s=0.5)
            if message is None:
                continue
            try:
                await self.handle(message)
            except Exception:  # nothing a client sends may stop the control plane
                self.counters["internal_errors"] += 1
                log.exception("control: internal error on %s", message.topic)

    # --- requests --------------------------------------------------------------------------------

    async def handle(self, message: InboundMessage) -> None:
        self.counters["requests"] += 1
        op = control_op_of(self.gateway_id, message.topic) or ""
        peek_topic, correlation_id = peek_reply_fields(message.payload)
        target = message.response_topic or peek_topic
        default = control_response_prefix(self.gateway_id) + (op if is_valid_id(op) else "_unknown")
        try:
            if target is not None and not is_control_response_topic(self.gateway_id, target):
                target = None
                raise ControlError(
                    "bad_response_topic",
                    f"must be {control_response_prefix(self.gateway_id)}"
                    "<id> (one level); answered here instead",
                    field="response_topic",
                )
            if message.retain:  # a live one too: the subscription keeps its flag (retain as published)
                why = "a request must not be retained (it would run again on every reconnect)"
                raise ControlError("retained", why, field="retain")
            if message.oversize_bytes is not None:  # refused by the MQTT reader, its payload never read
                raise ControlError("too_large", f"a {message.oversize_bytes}-byte packet", field="<payload>")
            request = parse_request(op, message.payload)
            correlation_id = request.correlation_id
            data = await self._execute(op, request)
            response = self._response(op, "ok", correlation_id, data=data)
            self.counters["ok"] += 1
        except ControlError as exc:
            self.refused[exc.reason] = self.refused.get(exc.reason, 0) + 1
            self._warn.warning(
                exc.reason, "control: refused %s (%s): %s", op[:64] or "<no op>", exc.reason, exc.detail[:300]
            )
            response = self._response(
                op,
                "error",
                correlation_id,
                error=ErrorBody(reason=exc.reason, field=exc.field, detail=exc.why),
            )
        await self._publish(
            target or default,
            response.model_dump_json(exclude_none=True).encode(),
            retain=False,
            correlation_data=message.correlation_data,
        )

    def _response(
        self,
        op: str,
        status: ResponseStatus,
        correlation_id: str | None,
        data: dict | None = None,
        error: ErrorBody | None = None,
    ) -> ControlResponse:
        return ControlResponse(
            op=op[:64],
            status=status,
            correlation_id=correlation_id,
            revision=self.revision,
            digest=self._digest,
            data=data,
            error=error,
        )

    async def _execute(self, op: str, request: Any) -> dict[str, Any]:
        if op in self.ops:  # read-only ops another subsystem answers, briefly
            return await self.ops[op](request)
        if op in READ_ONLY_OPS:
            return self._read(op, request)
        if isinstance(request, ServiceRestartRequest):
            return await self._restart(request.service)
        async with self._lock:
            if request.revision is not None and request.revision != self.revision:
                raise ControlError(
                    "stale_revision",
                    f"the change is based on revision {request.revision} "
                    f"but the config is at revision {self.revision}; get it again",
                    field="revision",
                )
            new = apply_change(self.config, request, self._catalog)
            check_placement_pins(self._catalog, new)
            check_model_pins(self._models, self.config, new)
            changed = changed_services(self.config, new)
            if changed:
                whole = request.service if isinstance(request, ConfigSetRequest) else None
                overrides = overrides_after(self._overrides, self.config, new, whole)
                await self._commit(new, overrides, changed, op)
        return {"changed": bool(changed), "services": {s: self._service_view(s) for s in changed}}

    def _read(self, op: str, request: Any) -> dict[str, Any]:
        if isinstance(request, ConfigGetRequest):
            return self._service_view(request.service)
        if op == "services.list":
            return {"services": [self._service_view(s) for s in SERVICE_NAMES]}
        return self._reports.read(request, allow=self.config.sensor.allow)

    async def _restart(self, service: str) -> dict[str, Any]:
        """Stop and start ``service`` with its desired config, which does not change (nor the revision)."""
        async with self._lock:
            await self.states.restart(service, getattr(self.config, service))
            await self._publish_service(service)
            await self._publish_event(service, "service.restart")
            return self._service_view(service)

    async def _commit(
        self, new: DesiredConfig, overrides: dict[str, dict[str, Any]], changed: list[str], why: str
    ) -> None:
        """Persist, then make current, then apply: the order that makes a crash at any point harmless."""
        # from plain data: the model checks that each key of ``overrides`` (a str to ops.py) is a ServiceName
        stored = StoredControl.model_validate(
            {"revision": self.revision + 1, "overrides": overrides, "updated_ts": self._clock()}
        )
        try:
            await asyncio.to_thread(self._store.save, stored)
        except OSError as exc:
            raise ControlError("storage", f"cannot persist the change: {exc.strerror or exc}") from None
        self.config, self.revision, self._overrides = new, stored.revision, overrides
        self._digest = digest(new)
        self.counters["changes"] += 1
        for service in changed:
            self._service_revision[service] = self.revision
            await self.states.apply(service, getattr(new, service))
            await self._publish_service(service)
            await self._publish_event(service, why)
        log.info(
            "control: revision %d (%s): %s",
            self.revision,
            why,
            ", ".join(f"{s} {self.states.current(s).state}" for s in changed),
        )

    async def report(self, service: str, applied: Applied) -> None:
        """A service reached ``applied`` on its own: keep it and publish its retained state again (a
        report older than the answer of an apply that runs is dropped: gateway/control/states.py)."""
        if self.states.report(service, applied):
            await self._publish_news(service)

    async def _publish_news(self, service: str) -> None:
        """A state the service reached on its own; not connected, the birth on the next connect has it."""
        if self.adapter.connected:
            await self._publish_service(service)

    async def reload_base(self, base: DesiredConfig) -> list[str]:
        """A new config file (SIGHUP); the overrides stay on top. ControlError if the result is invalid."""
        async with self._lock:
            new = effective(base, self._overrides)
            check_placement_pins(self._catalog, new)
            changed = changed_services(self.config, new)
            self.base = base
            if changed:
                await self._commit(new, self._overrides, changed, "reload")
            return changed

    # --- views and publishing --------------------------------------------------------------------

    def _service_view(self, service: str) -> dict[str, Any]:
        return {
            "service": service,
            "revision": self._service_revision[service],
            "config": getattr(self.config, service).model_dump(mode="json"),
            "overridden": sorted(self._overrides.get(service, {})),
            "handler": "connected" if self.handlers.is_connected(service) else "none",
            **self.states.current(service).as_dict(),
        }

    async def _publish_service(self, service: str) -> None:
        view = self._service_view(service)
        common = {"v": 1, "service": service, "revision": view["revision"]}
        config = {**common, "config": view["config"], "overridden": view["overridden"]}
        state = {**common, **{key: view[key] for key in ("state", "applied", "detail")}}
        for leaf, body in (("config", config), ("state", state)):
            await self._publish(
                service_topic(self.gateway_id, service, leaf), json.dumps(body).encode(), retain=True
            )

    async def _publish_event(self, service: str, op: str) -> None:
        """What an accepted change (or a restart) did to ``service``, on its ``events`` topic."""
        event = {
            "v": 1,
            "service": service,
            "revision": self.revision,
            "op": op,
            "ts": round(self._clock(), 3),
            **self.states.current(service).as_dict(),
        }
        await self._publish(
            service_topic(self.gateway_id, service, "events"), json.dumps(event).encode(), retain=False
        )

    async def _publish_birth(self) -> None:
        self.counters["births"] += 1
        for service in SERVICE_NAMES:
            await self._publish_service(service)

    async def _publish(
        self, topic: str, payload: bytes, retain: bool, correlation_data: bytes | None = None
    ) -> None:
        try:
            await self.adapter.publish(
                topic,
                payload,
                qos=1,
                retain=retain,
                wait=False,
                correlation_data=correlation_data,
                expiry_s=None if retain else RESPONSE_EXPIRY_S,
            )
        except MqttError as exc:
            self.counters["publish_failures"] += 1
            self._warn.warning("publish", "control: cannot publish on %s: %s", topic, exc)

    def stats(self) -> dict[str, int]:
        return {**self.counters, "refused": sum(self.refused.values()), "revision": self.revision}

    def status(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "digest": self._digest,
            **self.stats(),
            "connected": int(self.adapter.connected),
            "refused_by_reason": dict(self.refused),
            "services": {s: self.states.current(s).state for s in SERVICE_NAMES},
            "problems": self.states.unhealthy(),
        }

    def overrides(self) -> Mapping[str, Mapping[str, Any]]:
        return self._overrides
