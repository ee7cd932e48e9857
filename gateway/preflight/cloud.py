"""The cloud checks of ``gatewayctl check``: cloudd answers its probe path (``/healthz``), accepts the
gateway's token, and keeps a clock close to this box's.

The token check is an authenticated GET that changes nothing: the status of a blob that does not
exist (``/v1/gateways/<gw>/blobs/gatewayctl-check/status``), which cloudd answers 200 for the
gateway's own token and 401 (403: another gateway's) for any other (docs/http-api.md). The clock is
compared with the probe answer's ``Date`` header, whose whole seconds leave half a second either way.

Invariant: GETs only, each within ``timeout_s``; the clock (``clock``) is injected.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime

import aiohttp

from gateway.preflight.outcome import Check, reason
from gateway.uplink.sender import read_token
from protocol.config import GatewayConfig

CLOCK_WARN_S = 5.0  # more skew than this and the cloud's times and the gateway's disagree visibly
TOKEN_PROBE_BLOB = "gatewayctl-check"


async def check_cloud(
    config: GatewayConfig, timeout_s: float, clock: Callable[[], float] = time.time
) -> list[Check]:
    """cloud, cloud_token, clock: the last two are a SKIP when cloudd cannot be reached."""
    base = config.uplink.cloud_url.rstrip("/")
    probe = base + config.placement.probe_path
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        sent_at, start = clock(), loop.time()
        try:
            async with session.get(probe) as response:
                await response.read()
                status, date = response.status, response.headers.get("Date")
        except (aiohttp.ClientError, TimeoutError) as exc:
            why = f"no answer within {timeout_s:g}s" if isinstance(exc, TimeoutError) else reason(exc)
            skip = "cloudd is unreachable"
            return [
                Check("cloud", "FAIL", f"GET {probe}: {why}"),
                Check("cloud_token", "SKIP", skip),
                Check("clock", "SKIP", skip),
            ]
        took_ms, local = (loop.time() - start) * 1000, (sent_at + clock()) / 2
        if status != 200:
            reached = Check("cloud", "FAIL", f"GET {probe} answered {status}")
        else:
            reached = Check("cloud", "OK", f"GET {probe}: 200 ({took_ms:.0f} ms)")
        token = await _check_token(config, session, base)
    return [reached, token, _check_clock(local, date)]


async def _check_token(config: GatewayConfig, session: aiohttp.ClientSession, base: str) -> Check:
    uplink, gateway = config.uplink, config.gateway_id
    try:
        token = read_token(uplink.token, uplink.token_file)
    except OSError as exc:
        return Check("cloud_token", "FAIL", f"uplink.token_file: cannot read: {exc.strerror or exc}")
    if token is None:
        return Check("cloud_token", "FAIL", "no uplink.token or uplink.token_file: cloudd refuses uploads")
    url = f"{base}/v1/gateways/{gateway}/blobs/{TOKEN_PROBE_BLOB}/status"
    try:
        async with session.get(url, headers={"Authorization": f"Bearer {token}"}) as response:
            status, body = response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Check("cloud_token", "FAIL", f"GET {url}: {reason(exc)}")
    if status == 200:
        return Check("cloud_token", "OK", f"cloudd accepts the token of gateway {gateway}")
    try:
        error = json.loads(body)
        why = f"{error['error']}: {error['detail']}"
    except (ValueError, KeyError, TypeError):
        why = body[:200].decode(errors="replace")
    refused = status in (401, 403)  # anything else is not about the token: looked at, not failed
    return Check("cloud_token", "FAIL" if refused else "WARN", f"GET {url} answered {status} ({why})")


def _check_clock(local: float, date: str | None) -> Check:
    """This box's clock against the ``Date`` cloudd answered with (``local``: mid-request)."""
    if date is None:
        return Check("clock", "WARN", "cloudd's answer has no Date header to compare with")
    try:
        cloud = parsedate_to_datetime(date).timestamp() + 0.5  # Date is truncated to the second
    except (TypeError, ValueError):
        return Check("clock", "WARN", f"cloudd's Date header {date!r} does not parse")
    skew = local - cloud
    where = f"{abs(skew):.0f}s {'ahead of' if skew > 0 else 'behind'} cloudd's"
    if abs(skew) > CLOCK_WARN_S:
        return Check("clock", "WARN", f"this box's clock is {where} (more than {CLOCK_WARN_S:g}s: check NTP)")
    return Check("clock", "OK", f"this box's clock is {where} (within {CLOCK_WARN_S:g}s)")
