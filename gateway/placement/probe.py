"""LinkProber: one asyncio task that probes an HTTP URL (e.g. cloudd's /healthz) and feeds a LinkMonitor.

Invariants: one owner starts and stops it; every request has a timeout (a light probe's is the
monitor's ``probe_timeout_s``: a few round trips of the link as estimated, at most ``timeout_s``,
so a black hole is told apart from a live link quickly); a failure of any kind
(timeout, reset, refused, HTTP 5xx) is reported to the monitor as a failed probe, never raised.
Probes are spaced ``interval_s`` apart, jittered by +-``jitter`` of it (a link flapping with a period
near the interval must not be sampled in the same phase every time, or it looks simply down), and
``fast_interval_s`` apart while the monitor is *unsettled* (down, or a transition in its window):
a flapping link shows its transitions within a few of its periods, and a returning one is seen soon.
Optionally a probe also POSTs ``payload_bytes`` to ``goodput_url`` (at most once per
``goodput_every`` normal intervals, whatever the probe rate) and reports it as an upload, so goodput
is measured even when there is nothing to send; it is skipped
when real uploads at least as large gave the monitor a goodput sample since the last payload probe
(they measured the link already, and a probe's bytes cost as much as real ones on a metered link).
A failure the monitor calls *suspect* (a real upload or a probe failed or stalled, the link is still
believed up) brings the next probe forward to ``confirm_after_s`` after the last one began (at once
if that is past: a stall is reported a second or more into its request): an outage is confirmed (or
the suspicion cleared) within about a second, not a whole ``interval_s``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

import aiohttp

from gateway.placement.link import LinkMonitor
from runtime.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)


class LinkProber:
    def __init__(
        self,
        monitor: LinkMonitor,
        url: str,
        *,
        interval_s: float = 5.0,
        timeout_s: float = 2.0,
        goodput_url: str | None = None,
        payload_bytes: int = 32 * 1024,
        goodput_every: int = 4,
        upload_timeout_s: float = 10.0,
        confirm_after_s: float = 1.0,
        fast_interval_s: float | None = None,
        jitter: float = 0.25,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0 <= jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        self._monitor = monitor
        self._url = url
        self._interval = interval_s
        # Unsettled, probe about once a second (never slower than the normal interval): the prober's
        # own share of a flapping link's transitions needs a few probes per up/down period.
        self._fast_interval = min(interval_s, fast_interval_s or max(confirm_after_s, interval_s / 5))
        self._jitter = jitter
        self._rng = rng or random.Random()
        self._payload_every_s = goodput_every * interval_s
        self._last_payload_at: float | None = None
        self._timeout_s = timeout_s
        self._upload_timeout = aiohttp.ClientTimeout(total=upload_timeout_s)  # a slow link is not a dead one
        self._goodput_url = goodput_url
        self._payload = b"\0" * payload_bytes
        self._clock = clock
        self._confirm_after = confirm_after_s
        self._suspect = asyncio.Event()
        monitor.add_suspect_listener(self._suspect.set)
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.probes = 0
        self.failures = 0
        self.payload_probes = 0
        self.payload_probes_skipped = 0
        self.confirm_probes = 0
        self._samples_seen = 0  # monitor.large_goodput_samples after our last payload probe (or skip)

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("LinkProber already started")
        self._session = aiohttp.ClientSession()
        self._task = asyncio.create_task(self._run(), name="link-prober")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def probe_once(self) -> float | None:
        """One GET; returns the round trip in seconds or None, and reports it to the monitor."""
        assert self._session is not None, "start() first"
        start = self._clock()
        rtt: float | None = None
        timeout = aiohttp.ClientTimeout(total=self._monitor.probe_timeout_s(self._timeout_s))
        try:
            async with self._session.get(self._url, timeout=timeout) as resp:
                await resp.read()
                if resp.status < 500:
                    rtt = self._clock() - start
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.debug("probe %s failed: %r", self._url, exc)
        self.probes += 1
        self.failures += rtt is None
        self._monitor.observe_probe(rtt)
        return rtt

    async def upload_once(self) -> bool:
        assert self._session is not None and self._goodput_url is not None
        start = self._clock()
        ok = False
        try:
            async with self._session.post(
                self._goodput_url, data=self._payload, timeout=self._upload_timeout
            ) as resp:
                await resp.read()
                ok = resp.status < 500
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.debug("goodput probe %s failed: %r", self._goodput_url, exc)
        self._monitor.observe_upload(len(self._payload), self._clock() - start, ok)
        return ok

    def payload_probe_needed(self) -> bool:
        """False when real uploads measured goodput since the last payload probe (then none is sent)."""
        needed = self._monitor.large_goodput_samples == self._samples_seen
        self._samples_seen = self._monitor.large_goodput_samples
        return needed

    async def maybe_upload(self) -> bool | None:
        """A payload probe if ``payload_probe_needed``; None when skipped."""
        if not self.payload_probe_needed():
            self.payload_probes_skipped += 1
            return None
        self.payload_probes += 1
        ok = await self.upload_once()
        self._samples_seen = self._monitor.large_goodput_samples
        return ok

    def next_interval(self) -> float:
        """Seconds from one probe's start to the next: jittered, shorter while the link is unsettled."""
        base = self._fast_interval if self._monitor.unsettled else self._interval
        return base * (1 + self._jitter * self._rng.uniform(-1, 1))

    def payload_due(self, now: float) -> bool:
        return self._last_payload_at is None or now - self._last_payload_at >= self._payload_every_s

    async def _run(self) -> None:
        while True:
            started = self._clock()
            rtt = await self.probe_once()
            if self._goodput_url is not None and rtt is not None and self.payload_due(started):
                self._last_payload_at = started
                await self.maybe_upload()
            await self._wait_next(started, self.next_interval())

    async def _wait_next(self, last_probe_at: float, interval: float) -> None:
        """Until the next probe is due: ``interval`` after the last, or soon after a suspect failure
        (including one during the last probe)."""
        left = interval - (self._clock() - last_probe_at)
        if not await wait_event(self._suspect, max(0.0, left)):
            return
        self._suspect.clear()
        self.confirm_probes += 1
        since = self._clock() - last_probe_at
        await asyncio.sleep(max(0.0, min(self._confirm_after, interval) - since))
