"""The MQTT adapter's inbound queue: messages read from the broker, not yet taken by their consumer.

Its owner (gateway/mqtt/adapter.py) puts what paho reads; the consumer takes in arrival order. The
queue is bounded by the socket: full, it stops reading (``SocketDriver.set_reading``), so the rest
waits in the socket and at the broker.

Invariant: an inbound message is never dropped. When the queue holds ``bound`` messages, reading the
socket stops and starts again once the consumer has taken half of them. Messages already inside one
``loop_read`` call are still queued, so the queue may exceed its bound by that much (counted as
``overfull``). The consumer takes one message or a batch (``take_batch``), in arrival order. While
the intake is held nothing is handed out, and nothing is lost either.
"""

from __future__ import annotations

import asyncio
import collections

from gateway.mqtt.socket_driver import SocketDriver
from gateway.mqtt.types import InboundMessage, MqttCounters
from runtime.tasks import wait_event


class InboundQueue:
    def __init__(self, bound: int, socket: SocketDriver, counters: MqttCounters) -> None:
        self.bound = bound
        self._socket = socket
        self._counters = counters
        self._messages: collections.deque[InboundMessage] = collections.deque()
        self._ready = asyncio.Event()
        self._held = False
        self._unheld = asyncio.Event()

    def __len__(self) -> int:
        return len(self._messages)

    def put(self, message: InboundMessage) -> None:
        self._messages.append(message)
        if len(self._messages) > self.bound:
            self._counters.overfull += 1
        if len(self._messages) >= self.bound and not self._socket.reading_paused:
            self._counters.paused += 1
            self._socket.set_reading(False)
        self._ready.set()

    async def take(self, timeout_s: float) -> InboundMessage | None:
        """The next message in arrival order, or None after ``timeout_s`` seconds."""
        batch = await self.take_batch(timeout_s, 1)
        return batch[0] if batch else None

    async def take_batch(self, timeout_s: float, limit: int) -> list[InboundMessage]:
        """The next messages in arrival order, as many as are queued up to ``limit``, waiting up to
        ``timeout_s`` seconds for the first (none: an empty list).

        While the intake is held (``hold(True)``) nothing is handed out: messages wait in the queue,
        then (queue full) at the broker.
        """
        if self._held:
            await wait_event(self._unheld, timeout_s)
            return []
        if not self._messages:
            self._ready.clear()
            await wait_event(self._ready, timeout_s)
            if not self._messages:
                return []
        messages = self._messages
        batch = [messages.popleft() for _ in range(min(limit, len(messages)))]
        if self._socket.reading_paused and not self._socket.closing and len(messages) <= self.bound // 2:
            self._socket.set_reading(True)
        return batch

    def hold(self, held: bool) -> None:
        """Hold (True) or release (False) the intake: a stopped service takes nothing, loses nothing."""
        self._held = held
        if held:
            self._unheld.clear()
        else:
            self._unheld.set()

    @property
    def held(self) -> bool:
        return self._held
