"""Link monitor: RTT, goodput and availability of the uplink, from real uploads and light probes.

Invariants:
- Estimates come only from observations (``observe_probe``, ``observe_upload``) stamped with the
  injected clock; goodput is ``prior_goodput_Bps`` until a large enough upload has been seen.
- Noise in an upload's time is one-sided (a server's fsync, a busy event loop, a round trip only
  add time), so a goodput sample is a lower bound unless its transfer took long enough for the
  link to dominate: a *censored* sample (transfer under ``min_transfer_s``, or under half the
  upload's time) may raise the estimate, never lower it. On a steady link the estimate therefore
  only climbs to the link's rate and stays there; a slower link shows in long transfers.
- RTT is an EWMA that jumps on a *confirmed level shift*: two samples in a row beyond
  ``shift_ratio`` times the estimate, on the same side, replace it with their geometric mean (a
  link that changed is believed within two samples; a single outlier only moves it by alpha).
  Goodput (``GoodputFilter``) jumps the same way upward, and downward on two *measured* samples.
- What the planner sees as the round trip (``LinkEstimate.view``) is the *floor*: the least round
  trip of the last ``RTT_PLAN_WINDOW_S`` or of the last ``RTT_PLAN_SAMPLES``, whichever are more,
  since the start or the last return (the first round trip after a return is believed). A round
  trip's noise is one-sided too: the gateway's own busy event loop (a weak box whose CPU quota its
  inference spends) only adds time, and the EWMA followed it (seen: 1 ms -> 78 -> 330 ms on an
  unchanged localhost link while the edge worked through a burst of frames, and the plan moved
  inference back to the edge it was saturating). A link that really got slower without an outage
  is believed once every probe of the window says so.
- A link that comes back is not assumed to be the one that left: the up-transition restarts the
  estimates (RTT unknown, goodput back to ``prior_goodput_Bps``, unmeasured), so the first samples
  after an outage set them, rather than needing two confirmations against the old link's levels.
  (Seen: back from a black hole onto a 50 kB/s link, the plan trusted the old 7 MB/s for 2 s and
  sent frames to the cloud that waited 8 s.) Until ``SETTLE_SAMPLES`` round trips were measured,
  after the start or such a return, the link is *unsettled*: a prober looks more often.
- Availability: the link is *down* after ``down_after_failures`` consecutive failures and *up*
  after one success; it is *flapping* while the window holds ``flap_transitions`` or more
  up/down transitions, whatever its instantaneous state, unless it has *settled*: its current
  up or down stretch has lasted ``settle_factor`` times the longest stretch between the window's
  transitions (the flaps are over; the window need not age out first).
- ``flapping_since`` is when the current flapping episode was first seen (at the observation that
  made it, or the first snapshot that saw it), None while not flapping; ``first_flapping_at`` and
  ``flapping_episodes`` keep the history.
- ``up_for_s`` (since the last return) and ``longest_down_s`` (the window's longest down stretch
  that has ended) let the planner keep tasks at the edge while a returning link settles
  (``cost.drop_risk``); they come from the transitions the availability state is made of.
- Every sample store is bounded (``window_samples``); nothing here does I/O (see ``probe.py``).
- A *stall* (``observe_stall``: a request outstanding for its ``stall_after_s``, told by its owner)
  is a failure: through a black hole nothing fails until a timeout far off, but a request that
  takes ``stall_factor`` times what the estimates predict (never under ``min_stall_s``) is
  evidence enough to confirm the link now. Its answer, when it comes, is observed as usual.
- Listeners (``add_listener``) are called synchronously on each up/down transition, in order;
  suspect listeners (``add_suspect_listener``) on each failure that leaves the link believed up
  (so that a prober can confirm or clear it now, not one probe interval later).
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry

from gateway.placement.cost import LinkState, LinkView
from gateway.placement.estimators import GoodputFilter, ShiftingEwma
from gateway.placement.link_metrics import LinkMetrics

log = logging.getLogger(__name__)

RTT_PLAN_WINDOW_S = 10.0  # the planner's round trip: the least of those measured this long back,
RTT_PLAN_SAMPLES = 5  # or of this many, whichever are more (a settled prober looks every 5 s)
RTT_FLOOR_SAMPLES = 3  # the round trip taken out of an upload's time: the least of this many probes
SETTLE_SAMPLES = 3  # round trips measured before the estimates count as settled (after start or a return)

Observation = Literal["probe", "upload", "stall"]  # the edgefed_link_observations "kind" label
DEFAULT_RTT_S = 0.1  # the round trip assumed before any probe answered


@dataclass(frozen=True)
class LinkEstimate:
    at: float
    state: LinkState
    rtt_s: float | None  # EWMA
    rtt_window_s: float | None  # median of the window
    goodput_Bps: float  # EWMA of log goodput (the prior until measured)
    goodput_window_Bps: float | None  # median of the window
    goodput_measured: bool
    up_fraction: float  # of the window's time
    transitions: int  # in the window
    consecutive_failures: int
    last_success_at: float | None
    flapping_since: float | None = None  # the current flapping episode began (None: not flapping)
    rtt_floor_s: float | None = None  # least of RTT_PLAN_WINDOW_S (module docstring)
    up_for_s: float = math.inf  # up since the last return (inf: up, no return remembered; 0: down)
    longest_down_s: float = 0.0  # the longest down stretch that ended in the window

    def view(self, default_rtt_s: float = DEFAULT_RTT_S) -> LinkView:
        """What the planner sees: the round trip's floor, the goodput's EWMA, the availability state and
        how long the link has been back after its longest recent down stretch (the planner lets it settle)."""
        rtt = next((r for r in (self.rtt_floor_s, self.rtt_s) if r is not None), default_rtt_s)
        return LinkView(
            self.state, rtt, self.goodput_Bps, self.up_fraction, self.up_for_s, self.longest_down_s
        )


class LinkMonitor:
    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        alpha: float = 0.3,
        window_s: float = 30.0,
        window_samples: int = 256,
        down_after_failures: int = 2,
        flap_transitions: int = 4,
        settle_factor: float = 1.5,
        shift_ratio: float = 2.0,
        prior_goodput_Bps: float = 125_000.0,
        min_goodput_bytes: int = 4096,
        min_transfer_s: float = 0.5,
        large_upload_bytes: int = 32 * 1024,
        stall_factor: float = 4.0,
        min_stall_s: float = 1.0,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        if shift_ratio <= 1 or settle_factor <= 0:
            raise ValueError("shift_ratio must be > 1 and settle_factor > 0")
        self._clock = clock
        self.window_s = window_s
        self._down_after = down_after_failures
        self._flap_transitions = flap_transitions
        self._settle_factor = settle_factor
        self._min_goodput_bytes = min_goodput_bytes
        self._min_transfer_s = min_transfer_s
        self._stall_factor, self._min_stall_s = stall_factor, min_stall_s
        self._rtt = ShiftingEwma(alpha, shift_ratio, log_space=False)
        # Goodput spans orders of magnitude (MB/s to kB/s): averaged in log space, so that one sample
        # of a collapsed link moves the estimate by a factor, not by alpha of the old value.
        self._prior_goodput = prior_goodput_Bps
        self._goodput = GoodputFilter(alpha, shift_ratio, prior_goodput_Bps)
        self._fresh_rtts = 0  # round trips measured since the start or the last return
        self._uplink_bytes = 0  # on the link now, as the uplink last said (uplink_in_flight)
        self.estimate_restarts = 0
        # Samples from uploads of at least large_upload_bytes: on a fast link a small upload is mostly
        # round trip, so only these measure goodput as well as the prober's payload (which it then skips).
        self._large_upload_bytes = large_upload_bytes
        self.large_goodput_samples = 0
        self._rtts: deque[tuple[float, float]] = deque(maxlen=window_samples)
        self._goodputs: deque[tuple[float, float]] = deque(maxlen=window_samples)
        self._transitions: deque[tuple[float, bool]] = deque(maxlen=window_samples)  # (at, now_up)
        self._up = True  # optimistic until told otherwise: the first failures will say so
        self._failures = 0
        self._last_success: float | None = None
        self._last_failure: float | None = None
        self._started = clock()
        self.flapping_since: float | None = None
        self.first_flapping_at: float | None = None
        self.flapping_episodes = 0
        self.censored_goodput_samples = 0  # lower bounds that did not raise the estimate
        self.return_round_trip_s = 0.0  # of the success that last brought the link back
        self._metrics = LinkMetrics(registry) if registry is not None else None
        self._listeners: list[Callable[[bool], None]] = []
        self._suspect_listeners: list[Callable[[], None]] = []
        self.listener_errors = 0

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Export the gauges on ``registry`` (once; for owners whose registry is made later)."""
        if self._metrics is not None:
            raise RuntimeError("LinkMonitor metrics are already registered")
        self._metrics = LinkMetrics(registry)
        self._publish()

    def add_listener(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(now_up)`` on every up/down transition (e.g. the uplink retries on up)."""
        self._listeners.append(callback)

    def add_suspect_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` on every failure after which the link is still believed up."""
        self._suspect_listeners.append(callback)

    def _notify(self, now_up: bool) -> None:
        for callback in self._listeners:
            self._call(callback, now_up)

    def _call(self, callback: Callable[..., None], *args: bool) -> None:
        try:
            callback(*args)
        except Exception:  # a listener's bug must not break the estimates
            self.listener_errors += 1
            log.exception("link listener failed")

    # -- observations ------------------------------------------------------------------------
    def observe_probe(self, rtt_s: float | None) -> None:
        """A light probe's round trip in seconds, or None when it failed or timed out."""
        if rtt_s is None:
            self._failure("probe")
            return
        now = self._clock()
        self._restart_if_returning(rtt_s)
        self._rtt.add(rtt_s)
        self._rtts.append((now, rtt_s))
        self._fresh_rtts += 1
        self._success(now, "probe")

    def observe_upload(self, nbytes: int, seconds: float, ok: bool) -> None:
        """A real upload: its size, how long it took, and whether the cloud acknowledged it."""
        if not ok:
            self._failure("upload")
            return
        now = self._clock()
        self._restart_if_returning(seconds)
        if nbytes >= self._min_goodput_bytes and seconds > 0:
            # An acknowledged upload costs one round trip besides the transfer: take out the smallest of
            # the last few (one slow probe must not inflate goodput; an old, faster link's must not
            # deflate it), never more than half the upload's time.
            transfer = max(seconds - self._rtt_floor(), seconds / 2)
            sample = nbytes / transfer
            # Censored: too short for the link to dominate (a small upload on a fast link, or a server's
            # fsync in the time): the sample only says goodput >= sample. It may raise the estimate,
            # never lower it (a 4 kB batch acknowledged in 130 ms after an fsync is not a 31 kB/s link).
            censored = transfer < self._min_transfer_s or transfer <= seconds / 2
            if self._goodput.add(sample, censored=censored):
                self._goodputs.append((now, sample))
                self.large_goodput_samples += nbytes >= self._large_upload_bytes
            else:
                self.censored_goodput_samples += 1
        self._success(now, "upload")

    def stall_after_s(self, nbytes: int) -> float:
        """How long a request carrying ``nbytes`` may take before it is a stall: ``stall_factor`` times
        one round trip plus the transfer at the estimated goodput, at least ``min_stall_s``."""
        rtt = self._rtt.value if self._rtt.value is not None else DEFAULT_RTT_S
        expected = rtt + nbytes / self._goodput.value
        return max(self._min_stall_s, self._stall_factor * expected)

    def observe_stall(self) -> None:
        """A request has been outstanding for its ``stall_after_s``: a failure (module docstring)."""
        self._failure("stall")

    def uplink_in_flight(self, nbytes: int) -> None:
        """The uplink has ``nbytes`` on the link now: a probe queues behind them."""
        self._uplink_bytes = nbytes

    def probe_timeout_s(self, longest_s: float) -> float:
        """A light probe's timeout: ``stall_after_s`` of an empty request, at most ``longest_s``; while
        the uplink has bytes in flight, as long as theirs (a drain that fills a slow link is no outage:
        its probes timing out called the link down, and its return abandoned the drain's requests)."""
        light = min(longest_s, self.stall_after_s(0))
        return max(light, self.stall_after_s(self._uplink_bytes)) if self._uplink_bytes else light

    def _restart_if_returning(self, round_trip_s: float) -> None:
        """The link is down and a success that took ``round_trip_s`` is about to bring it back:
        restart the estimates."""
        if not self._up:
            self.return_round_trip_s = round_trip_s
            self._rtt.restart()
            self._goodput.restart(self._prior_goodput)
            self._fresh_rtts = 0
            self.estimate_restarts += 1

    def _plan_rtt(self, now: float) -> float | None:
        """The least round trip of the last ``RTT_PLAN_WINDOW_S``, or of the last
        ``RTT_PLAN_SAMPLES``, whichever are more, since the start or the last return; None when none
        was measured since."""
        fresh = list(itertools.islice(reversed(self._rtts), self._fresh_rtts))  # newest first
        recent = [r for at, r in fresh if at >= now - RTT_PLAN_WINDOW_S]
        if len(recent) < RTT_PLAN_SAMPLES:
            recent = [r for _, r in fresh[:RTT_PLAN_SAMPLES]]
        return min(recent, default=None)

    def _rtt_floor(self) -> float:
        """The smallest of the last ``RTT_FLOOR_SAMPLES`` round trips of this link (since the start or
        the last return), 0 when none is known."""
        recent = itertools.islice(reversed(self._rtts), min(RTT_FLOOR_SAMPLES, self._fresh_rtts))
        return min((r for _, r in recent), default=0.0)

    @property
    def level_shifts(self) -> int:
        """Confirmed RTT and goodput level shifts so far (each made its estimate jump)."""
        return self._rtt.shifts + self._goodput.shifts

    def _success(self, now: float, kind: Observation) -> None:
        self._failures = 0
        self._last_success = now
        if not self._up:
            self._up = True
            self._transitions.append((now, True))
            self._state(now)  # a transition may start a flapping episode: stamp it now
            self._notify(True)
        if self._metrics:
            self._metrics.observations.labels(kind, "ok").inc()
        self._publish()

    def _failure(self, kind: Observation) -> None:
        now = self._clock()
        self._failures += 1
        self._last_failure = now
        if self._up and self._failures >= self._down_after:
            self._up = False
            self._transitions.append((now, False))
            self._state(now)
            self._notify(False)
        elif self._up:
            for callback in self._suspect_listeners:
                self._call(callback)
        if self._metrics:
            self._metrics.observations.labels(kind, "failed").inc()
        self._publish()

    # -- estimates ---------------------------------------------------------------------------
    def snapshot(self) -> LinkEstimate:
        now = self._clock()
        since = now - self.window_s
        transitions = self._window_transitions(since)
        state = self._state(now)
        rtts = [r for t, r in self._rtts if t >= since]
        goodputs = [g for t, g in self._goodputs if t >= since]
        return LinkEstimate(
            at=now,
            state=state,
            rtt_s=self._rtt.value,
            rtt_window_s=statistics.median(rtts) if rtts else None,
            goodput_Bps=self._goodput.value,
            goodput_window_Bps=statistics.median(goodputs) if goodputs else None,
            goodput_measured=self._goodput.measured,
            up_fraction=self._up_fraction(now, since, transitions),
            transitions=len(transitions),
            consecutive_failures=self._failures,
            last_success_at=self._last_success,
            flapping_since=self.flapping_since,
            rtt_floor_s=self._plan_rtt(now),
            up_for_s=self._up_for(now),
            longest_down_s=self._longest_down(since),
        )

    def _up_for(self, now: float) -> float:
        """How long the link has been up since its last return: 0 while down, inf with no return kept."""
        if not self._up:
            return 0.0
        return now - self._transitions[-1][0] if self._transitions else math.inf

    def _longest_down(self, since: float) -> float:
        """The longest down stretch (a down transition to the next up one) ended at or after ``since``."""
        pairs = zip(self._transitions, itertools.islice(self._transitions, 1, None), strict=False)
        return max((back - went for (went, up), (back, _) in pairs if not up and back >= since), default=0.0)

    def _window_transitions(self, since: float) -> list[tuple[float, bool]]:
        return [(t, up) for t, up in self._transitions if t >= since]

    def _state(self, now: float) -> LinkState:
        """The availability state at ``now``; keeps the flapping episode's bookkeeping."""
        transitions = self._window_transitions(now - self.window_s)
        if len(transitions) >= self._flap_transitions and not self._settled(now, transitions):
            if self.flapping_since is None:
                self.flapping_since = now
                self.flapping_episodes += 1
                if self.first_flapping_at is None:
                    self.first_flapping_at = now
                log.debug("link flapping: %d transitions in %.0f s", len(transitions), self.window_s)
            return "flapping"
        self.flapping_since = None
        return "up" if self._up else "down"

    @property
    def unsettled(self) -> bool:
        """Down, or a transition or a failure in the window, or too few round trips measured since the
        start or the last return: a prober should look more often (a failure cleared by the next
        success may be the first flap of many; a fresh estimate rests on a sample or two)."""
        since = self._clock() - self.window_s
        recent_failure = self._last_failure is not None and self._last_failure >= since
        fresh = self._fresh_rtts < SETTLE_SAMPLES
        return not self._up or recent_failure or fresh or bool(self._window_transitions(since))

    def _settled(self, now: float, transitions: list[tuple[float, bool]]) -> bool:
        """The current stretch outlasted every completed stretch in the window by settle_factor.

        Every stretch, up or down, not only those of the current kind: each is seen only to within a
        probe interval, so the longest of all is the safer measure of the flapping's time scale (a
        down stretch seen shorter than it was must not make the next one look settled)."""
        stretches = zip(transitions, transitions[1:], strict=False)
        longest = max((later - at for (at, _), (later, _) in stretches), default=math.inf)
        return now - transitions[-1][0] >= self._settle_factor * longest

    def _up_fraction(self, now: float, since: float, transitions: list[tuple[float, bool]]) -> float:
        start = max(since, self._started)
        if now <= start:
            return 1.0 if self._up else 0.0
        # The state at the window's start is the opposite of its first transition (or the current one).
        up = (not transitions[0][1]) if transitions else self._up
        up_time, t = 0.0, start
        for at, now_up in transitions:
            if up:
                up_time += at - t
            up, t = now_up, at
        if up:
            up_time += now - t
        return min(1.0, max(0.0, up_time / (now - start)))

    def _publish(self) -> None:
        if self._metrics is not None:
            self._metrics.publish(self.snapshot())
