"""The broker checks of ``gatewayctl check``: the broker is reachable, its TLS certificate verifies
with the configured CA (and takes the client certificate), and it accepts the gateway's login: a
real CONNECT with ``mqtt.username`` and ``mqtt.password_file``, through the adapter gatewayd uses.

Invariant: each check waits at most ``timeout_s``; the login uses a client id of its own
(``<client_id>-check-<hex>``, a clean session that expires at once), never the daemon's, which the
broker would take over, and publishes and subscribes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import ssl

from gateway.datadir import StartupError
from gateway.mqtt.adapter import MqttAdapter
from gateway.mqtt.types import MqttSettings, settings_from_config
from gateway.preflight.outcome import Check, reason
from gateway.provided_files import broker_tls_context
from protocol.config import GatewayConfig

LOOPBACK = ("127.0.0.1", "::1", "localhost")


async def check_broker(config: GatewayConfig, timeout_s: float) -> list[Check]:
    """broker, broker_tls, mqtt_login: a later one is a SKIP once an earlier one failed."""
    host, port, tls = MqttSettings(url=config.mqtt.broker, client_id="check").host_port_tls
    reach = await _reach(host, port, timeout_s)
    secure = await _tls(config, host, port, timeout_s) if tls else _plain(config, host)
    if reach.status == "FAIL":
        secure = Check("broker_tls", "SKIP", "the broker is unreachable") if tls else secure
        return [reach, secure, Check("mqtt_login", "SKIP", "the broker is unreachable")]
    if secure.status == "FAIL":
        return [reach, secure, Check("mqtt_login", "SKIP", "TLS failed")]
    return [reach, secure, await _login(config, timeout_s)]


async def _reach(host: str, port: int, timeout_s: float) -> Check:
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return Check("broker", "FAIL", f"{host}:{port}: no answer within {timeout_s:g}s")
    except OSError as exc:
        return Check("broker", "FAIL", f"cannot reach {host}:{port}: {reason(exc)}")
    took_ms = (loop.time() - start) * 1000
    writer.close()
    return Check("broker", "OK", f"{host}:{port} takes connections ({took_ms:.0f} ms)")


def _plain(config: GatewayConfig, host: str) -> Check:
    if config.mqtt.username is not None and host not in LOOPBACK:
        return Check("broker_tls", "WARN", f"{config.mqtt.broker}: no TLS, the password travels in clear")
    return Check("broker_tls", "OK", f"not used ({config.mqtt.broker})")


async def _tls(config: GatewayConfig, host: str, port: int, timeout_s: float) -> Check:
    mqtt = config.mqtt
    against = f"mqtt.ca_file {mqtt.ca_file}" if mqtt.ca_file else "the system's CAs"
    try:
        context = broker_tls_context(mqtt)
    except StartupError as exc:
        return Check("broker_tls", "FAIL", str(exc))
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        return Check(
            "broker_tls",
            "FAIL",
            f"the broker's certificate does not verify against {against}: {exc.verify_message}",
        )
    except ssl.SSLError as exc:
        return Check("broker_tls", "FAIL", f"TLS with {host}:{port} failed: {exc.reason or exc}")
    except TimeoutError:
        return Check("broker_tls", "FAIL", f"no TLS handshake with {host}:{port} within {timeout_s:g}s")
    except OSError as exc:
        return Check("broker_tls", "FAIL", f"TLS with {host}:{port} failed: {reason(exc)}")
    version = writer.get_extra_info("ssl_object").version()
    writer.close()
    client = f"; client certificate {mqtt.cert_file}" if mqtt.cert_file else ""
    return Check(
        "broker_tls", "OK", f"{version}, the broker's certificate verifies against {against}{client}"
    )


async def _login(config: GatewayConfig, timeout_s: float) -> Check:
    try:
        control = settings_from_config(config.mqtt, config.gateway_id, will=None, role="control")
    except OSError as exc:
        return Check("mqtt_login", "FAIL", f"mqtt.password_file: cannot read: {exc.strerror or exc}")
    client_id = f"{control.client_id.removesuffix('-control')}-check-{secrets.token_hex(3)}"
    settings = dataclasses.replace(control, client_id=client_id, connect_timeout_s=timeout_s)
    who = f"as user {settings.username}" if settings.username else "anonymously"
    adapter = MqttAdapter(settings)
    await adapter.start()
    try:
        async with asyncio.timeout(timeout_s):
            # polled: the adapter has no event for the outcome of a first try (its own wait_connected
            # polls the same way, and waits out the retries of a refused login)
            while not (adapter.connected or adapter.last_connect_error):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        refused = None if adapter.connected else adapter.last_connect_error
    except TimeoutError:
        refused = f"no CONNACK within {timeout_s:g}s"
    finally:
        await adapter.stop(timeout_s=1.0)
    if refused is not None:
        return Check("mqtt_login", "FAIL", f"CONNECT {who} failed: {refused}")
    return Check("mqtt_login", "OK", f"CONNECT {who} accepted (MQTT {settings.protocol_version})")
