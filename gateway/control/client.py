"""ControlClient: the operator's side of the control plane (what gatewayctl and tests use).

One short-lived MQTT connection (clean session, random client id). It subscribes to the gateway's
retained status and to its own response topic ``edgefed/<gw>/control/response/ctl-<hex>``, refuses
to send to a gateway whose status says offline, sends each request with MQTT v5 Response Topic and
Correlation Data (or, on 3.1.1, ``response_topic``/``correlation_id`` in the payload), and waits for
the answer that carries its correlation.

Invariant: every wait (connecting, the status, the answer) comes out of one budget of ``timeout_s``
that starts when the client is entered (or, for a command that keeps polling, ``logs --follow``,
when it ``renew``s it before a request), so a command ends within ``timeout_s`` plus the disconnect
(at most DISCONNECT_S); every failure becomes a ``CtlError`` whose message tells the operator what
to do (connect refused, not authorized, gateway offline, no answer in time).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

from gateway.mqtt.adapter import MqttAdapter, MqttError, MqttSettings
from protocol.config import MqttVersion
from protocol.control import ControlResponse, parse_response
from protocol.errors import ProtocolError
from protocol.topics import control_request_topic, control_response_topic, status_topic

STATUS_WAIT_S = 1.0  # a retained status arrives right after the SUBACK; none by then = never published
DISCONNECT_S = 1.0  # a clean disconnect takes milliseconds; a broker that does not answer gets this long


class CtlError(Exception):
    """A failure to report to the operator; ``exit_code`` is what gatewayctl exits with."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ControlClient:
    def __init__(
        self,
        broker: str,
        gateway_id: str,
        *,
        username: str | None = None,
        password: str | None = None,
        ca_file: Path | None = None,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        protocol_version: MqttVersion = "5",
        timeout_s: float = 5.0,
    ) -> None:
        self.gateway_id = gateway_id
        self.timeout_s = timeout_s
        token = secrets.token_hex(4)
        self.response_topic = control_response_topic(gateway_id, f"ctl-{token}")
        self._v5 = protocol_version == "5"
        self._adapter = MqttAdapter(
            MqttSettings(
                url=broker,
                client_id=f"gatewayctl-{token}",
                persistent_session=False,
                manual_ack=False,
                inbound_bound=256,
                username=username,
                password=password,
                ca_file=ca_file,
                cert_file=cert_file,
                key_file=key_file,
                protocol_version=protocol_version,
                connect_timeout_s=timeout_s,
                backoff_initial_s=0.2,
                backoff_max_s=1.0,
            )
        )
        self._adapter.subscribe(status_topic(gateway_id), qos=1)
        self._adapter.subscribe(self.response_topic, qos=1)
        self._sequence = 0
        self._deadline: float | None = None  # set on entry: every wait comes out of one budget
        self.status: dict[str, Any] | None = None
        self._status_seen = asyncio.Event()

    async def __aenter__(self) -> ControlClient:
        self._deadline = asyncio.get_running_loop().time() + self.timeout_s
        await self._adapter.start()
        try:
            await self._adapter.wait_connected(self._left())
        except MqttError:
            why = self._adapter.last_connect_error or f"no answer within {self.timeout_s:g}s"
            await self._adapter.stop(timeout_s=DISCONNECT_S)
            hint = " (check --username/--password-file)" if "authori" in why.lower() else ""
            raise CtlError(
                f"cannot connect to broker {self._adapter.settings.url}: {why}{hint}", exit_code=2
            ) from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._adapter.stop(timeout_s=DISCONNECT_S)

    def renew(self) -> None:
        """A whole new budget of ``timeout_s`` from now, for the next request of a command that polls."""
        self._deadline = asyncio.get_running_loop().time() + self.timeout_s

    def _left(self) -> float:
        """Seconds left of the budget (``timeout_s`` from entry)."""
        assert self._deadline is not None, "use the client as an async context manager"
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    async def read_status(self, wait_s: float = STATUS_WAIT_S) -> dict[str, Any] | None:
        """The gateway's retained status (online/offline), or None if it never published one."""
        await self._pump(lambda: self.status is not None, min(wait_s, self._left()))
        return self.status

    async def request(self, op: str, body: dict[str, Any] | None = None) -> ControlResponse:
        """Send one request and wait for its response; CtlError if offline, refused by the broker, or late."""
        status = await self.read_status(min(STATUS_WAIT_S, self._left() / 2))  # half left for the answer
        if status is not None and status.get("state") == "offline":
            raise CtlError(
                f"gateway {self.gateway_id} is offline (since {status.get('ts', '?')}); request not sent"
            )
        self._sequence += 1
        correlation = f"{self.response_topic.rsplit('/', 1)[1]}-{self._sequence}"
        payload = dict(body or {})
        if not self._v5:
            payload.update(response_topic=self.response_topic, correlation_id=correlation)
        try:
            topic = control_request_topic(self.gateway_id, op)
            await self._adapter.publish(
                topic,
                json.dumps(payload).encode(),
                qos=1,
                timeout_s=self._left(),
                response_topic=self.response_topic if self._v5 else None,
                correlation_data=correlation.encode() if self._v5 else None,
                expiry_s=int(max(1, self._left())) if self._v5 else None,
            )
        except MqttError as exc:
            raise CtlError(
                f"cannot send {op}: {exc} (is this user allowed to write "
                f"{control_request_topic(self.gateway_id, op)}?)",
                exit_code=2,
            ) from None
        answer: list[ControlResponse] = []

        def take(topic: str, payload: bytes, correlation_data: bytes | None) -> bool:
            if topic != self.response_topic:
                return False
            try:
                response = parse_response(payload)
            except ProtocolError:
                return False
            got = correlation_data.decode(errors="replace") if correlation_data else response.correlation_id
            if got == correlation:
                answer.append(response)
                return True
            return False

        await self._pump(lambda: bool(answer), self._left(), take)
        if not answer:
            state = (self.status or {}).get("state", "unknown: it never published a status")
            raise CtlError(
                f"no response from gateway {self.gateway_id} to {op} within {self.timeout_s:g}s "
                f"(its status: {state})"
            )
        return answer[0]

    async def _pump(self, done: Any, wait_s: float, on_other: Any = None) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while not done() and (left := deadline - loop.time()) > 0:
            message = await self._adapter.receive(timeout_s=left)
            if message is None:
                continue
            if message.topic == status_topic(self.gateway_id):
                try:
                    self.status = json.loads(message.payload)
                except ValueError:
                    raw = message.payload[:200].decode(errors="replace")
                    self.status = {"state": "unreadable", "raw": raw}
            elif on_other is not None:
                on_other(message.topic, message.payload, message.correlation_data)
