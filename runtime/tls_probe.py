"""Does the server at HOST:PORT speak TLS? Asked once a plain ``mqtt://`` connection ended before the
broker's CONNACK: a TLS listener reads MQTT's CONNECT as a broken TLS record and resets the
connection (mosquitto) or answers with a TLS alert (0x15 0x03 ...), which an MQTT client sees only
as a connection lost. The MQTT clients (gateway/mqtt/adapter.py, so gatewayctl too, and devicesim)
then say what is wrong: ``tls_hint``.

Invariant: a probe opens one TCP connection, offers a TLS handshake that verifies nothing and sends
no data, and closes it, waiting at most ``timeout_s`` for each step (the connection, each answer of
the handshake); it answers True only when the server answered in TLS (the handshake completed, or
the server sent a TLS alert).
"""

from __future__ import annotations

import socket
import ssl

PROBE_TIMEOUT_S = 2.0  # a TLS server answers a ClientHello in one round trip


def speaks_tls(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True if the server at ``host:port`` answers a TLS ClientHello in TLS (blocking)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # the question is whether it speaks TLS, not whom to trust
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except ssl.SSLError as exc:
        # a TLS server that refuses the handshake (no client certificate, no common version) says so
        # with an alert; a server that does not speak TLS closes, or sends bytes that are no record
        return "ALERT" in (exc.reason or "")
    except OSError:  # refused, reset, closed, timed out: no answer in TLS
        return False


def tls_hint(host: str, port: int) -> str:
    """What to tell the operator of a plain MQTT connection to a server that speaks TLS."""
    return f"the broker at {host}:{port} may expect TLS: use mqtts://"
