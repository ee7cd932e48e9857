"""The files the operator names in the config (``mqtt.password_file``, ``ca_file``, ``cert_file``,
``key_file``, ``uplink.token_file``), checked once before gatewayd builds anything (docs/gateway.md,
"Exit codes").

Invariant: gatewayd starts only if every file the config names can be read as text, and, for an
``mqtts://`` broker, the CA and the client certificate load as TLS does load them; otherwise one
``StartupError`` (exit 2) names the field and the path, rather than a traceback from whichever
reader met the file first.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from gateway.datadir import StartupError
from protocol.config import GatewayConfig, MqttConfig


def check_provided_files(config: GatewayConfig) -> None:
    """StartupError for the first named file that cannot be read or (TLS) loaded."""
    mqtt = config.mqtt
    named = {
        "mqtt.password_file": mqtt.password_file,
        "mqtt.ca_file": mqtt.ca_file,
        "mqtt.cert_file": mqtt.cert_file,
        "mqtt.key_file": mqtt.key_file,
        "uplink.token_file": config.uplink.token_file,
    }
    for field, path in named.items():
        if path is not None:
            _readable_text(field, path)
    if mqtt.broker.startswith("mqtts://"):
        broker_tls_context(mqtt)


def _readable_text(field: str, path: Path) -> None:
    try:
        path.read_text()  # as its reader reads it (a password or token is a line of text)
    except OSError as exc:
        raise StartupError(f"{field} {path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeError:
        raise StartupError(f"{field} {path}: cannot read: not text") from None


def broker_tls_context(mqtt: MqttConfig) -> ssl.SSLContext:
    """What paho's ``tls_set`` makes of the config's files: verify the broker against ``ca_file``
    (the system's CAs without one) and present the client certificate when one is configured.
    StartupError names the field whose file does not load."""
    try:
        context = ssl.create_default_context(cafile=str(mqtt.ca_file) if mqtt.ca_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(f"mqtt.ca_file {mqtt.ca_file}: not a PEM certificate ({_why(exc)})") from None
    if mqtt.cert_file is not None:
        key_file = mqtt.key_file
        try:
            context.load_cert_chain(str(mqtt.cert_file), str(key_file) if key_file is not None else None)
        except (OSError, ssl.SSLError) as exc:
            key = f" with mqtt.key_file {key_file}" if key_file is not None else ""
            raise StartupError(
                f"mqtt.cert_file {mqtt.cert_file}{key}: not a certificate and its key ({_why(exc)})"
            ) from None
    return context


def _why(exc: OSError) -> str:
    return str(getattr(exc, "reason", None) or exc.strerror or exc)
