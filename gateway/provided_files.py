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
from protocol.config import GatewayConfig


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
        _loads_as_tls(mqtt.ca_file, mqtt.cert_file, mqtt.key_file)


def _readable_text(field: str, path: Path) -> None:
    try:
        path.read_text()  # as its reader reads it (a password or token is a line of text)
    except OSError as exc:
        raise StartupError(f"{field} {path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeError:
        raise StartupError(f"{field} {path}: cannot read: not text") from None


def _loads_as_tls(ca_file: Path | None, cert_file: Path | None, key_file: Path | None) -> None:
    """What paho's ``tls_set`` does with them at the first connect, done now."""
    context = ssl.create_default_context()
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(ca_file))
        except ssl.SSLError as exc:
            raise StartupError(f"mqtt.ca_file {ca_file}: not a PEM certificate ({exc.reason})") from None
    if cert_file is not None:
        try:
            context.load_cert_chain(str(cert_file), str(key_file) if key_file is not None else None)
        except ssl.SSLError as exc:
            key = f" with mqtt.key_file {key_file}" if key_file is not None else ""
            raise StartupError(
                f"mqtt.cert_file {cert_file}{key}: not a certificate and its key ({exc.reason})"
            ) from None
