"""Paho's socket driven by the asyncio loop: what replaces paho's network thread for the MQTT adapter.

Built the way aiomqtt is. Paho's socket callbacks attach its socket to the loop (``add_reader`` and
``add_writer`` call ``loop_read`` and ``loop_write``) and a misc task calls ``loop_misc`` every second
(keepalive). The blocking TCP/TLS connect runs in another thread, so the socket callbacks fired
from it reach the loop through ``call_soon_threadsafe``. The owner (gateway/mqtt/adapter.py) pauses reading
when its inbound queue is full and resumes it once the queue has room.

A readable event reads on through the bytes already taken off the socket (the client's read-ahead,
gateway/mqtt/batched_client.py, and TLS's buffer), which the selector cannot see.

Invariant: the socket is registered for reading exactly when it is attached, open and not paused
(``reading_paused`` is False), and bytes read ahead are read on while it is not paused. A socket
paho closes on the loop thread leaves the loop before it is closed (a closed socket has no fd left
to remove); one closed from another thread (a client collected after its loop) leaves it by fd, and
only while that loop is still open.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho

from gateway.mqtt.batched_client import BatchedClient
from runtime.tasks import cancel_and_wait

MISC_INTERVAL_S = 1.0
PACKETS_PER_TURN = 1000  # packets read per readable event at most, then other callbacks run


class SocketDriver:
    """Drives one paho client's socket from the running loop; ``start`` on the loop, ``stop`` at the end."""

    def __init__(self, client: BatchedClient) -> None:
        self._client = client
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._sock: Any = None
        self._misc_task: asyncio.Task[None] | None = None
        self.reading_paused = False
        self.closing = False  # set by the owner when it stops: a socket attached from then on is not read
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_socket_register_write
        client.on_socket_unregister_write = self._on_socket_unregister_write

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._misc_task = asyncio.create_task(self._misc_loop(), name="mqtt-misc")

    async def stop(self) -> None:
        """End the misc task and close the socket (paho's close also detaches it from the loop)."""
        await cancel_and_wait(self._misc_task)
        self._misc_task = None
        self.close_socket()

    def close_socket(self) -> None:
        self._client._sock_close()

    async def _misc_loop(self) -> None:
        while True:
            await asyncio.sleep(MISC_INTERVAL_S)
            if self._sock is not None:
                self._client.loop_misc()

    def set_reading(self, on: bool) -> None:
        """Read the socket (True) or leave what the broker sends in the socket and at the broker (False)."""
        if self._sock is None or self._loop is None or self._sock.fileno() < 0:
            self.reading_paused = not on
            return
        if on and self.reading_paused:
            self._loop.add_reader(self._sock, self._readable)
            if self._unseen_bytes():
                self._loop.call_soon(self._readable)
        elif not on and not self.reading_paused:
            self._loop.remove_reader(self._sock)
        self.reading_paused = not on

    def _readable(self) -> None:
        """Read the packets there are now: one ``recv`` brings many, and each ``loop_read`` hands paho
        one; stop when the owner pauses reading. After ``PACKETS_PER_TURN`` the rest waits for the
        next turn of the loop (a broker that keeps the socket full never holds the loop)."""
        self._client.loop_read()
        for _ in range(PACKETS_PER_TURN):
            if self.reading_paused or not self._unseen_bytes():
                return
            self._client.loop_read()
        if not self.reading_paused and self._unseen_bytes():
            self._started_loop.call_soon(self._readable)

    def _unseen_bytes(self) -> bool:
        """Bytes already off the socket that the selector cannot see: the client's read-ahead
        (batched_client.py), or TLS's decrypted bytes."""
        if self._client.buffered_bytes:
            return True
        return isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0

    # --- paho's socket callbacks (on the loop thread, except open/write during connect) ---------

    @property
    def _started_loop(self) -> asyncio.AbstractEventLoop:
        """The loop ``start`` attached to; paho opens a socket, and so calls back, only after ``start``."""
        assert self._loop is not None, "SocketDriver.start() was not called"
        return self._loop

    def _in_loop(self, fn: Callable[..., None], *args: Any) -> None:
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            self._started_loop.call_soon_threadsafe(fn, *args)

    def _on_socket_open(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._in_loop(self._attach, sock)

    def _attach(self, sock: Any) -> None:
        self._sock = sock
        self.reading_paused = True
        self.set_reading(not self.closing)

    def _on_socket_close(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        # Detach before paho closes the socket: a closed socket has no fd to remove.
        if threading.get_ident() == self._loop_thread:
            self._detach(sock)
        elif self._loop is not None and not self._loop.is_closed():  # a client collected after its loop ended
            self._loop.call_soon_threadsafe(self._detach_fd, sock.fileno())

    def _detach(self, sock: Any) -> None:
        if self._sock is sock:
            self._sock = None
        with contextlib.suppress(ValueError, OSError):
            self._started_loop.remove_reader(sock)
            self._started_loop.remove_writer(sock)

    def _detach_fd(self, fd: int) -> None:
        self._sock = None
        if fd >= 0:
            self._started_loop.remove_reader(fd)
            self._started_loop.remove_writer(fd)

    def _on_socket_register_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._in_loop(self._add_writer, sock)

    def _add_writer(self, sock: Any) -> None:
        if sock.fileno() >= 0:
            self._started_loop.add_writer(sock, self._client.loop_write)

    def _on_socket_unregister_write(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._in_loop(self._remove_writer, sock)

    def _remove_writer(self, sock: Any) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._started_loop.remove_writer(sock)
