"""LinkMonitor with an injected clock: EWMA/window estimates, availability states, metrics."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.placement.link import LinkMonitor
from gateway.placement.runner import make_monitor
from protocol.config import PlacementConfig


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_rtt_ewma_and_window_median():
    clock = Clock()
    mon = LinkMonitor(clock=clock, alpha=0.5, window_s=10)
    for rtt in (0.1, 0.2, 0.3):
        clock.t += 1
        mon.observe_probe(rtt)
    est = mon.snapshot()
    assert est.rtt_s == pytest.approx(0.225)  # 0.1 -> 0.15 -> 0.225
    assert est.rtt_window_s == pytest.approx(0.2)
    clock.t += 20  # samples age out of the window, the EWMA stays
    assert mon.snapshot().rtt_window_s is None and mon.snapshot().rtt_s == pytest.approx(0.225)


def test_goodput_from_uploads_subtracts_one_rtt_and_ignores_small_ones():
    clock = Clock()
    mon = LinkMonitor(clock=clock, prior_goodput_Bps=1234.0, min_goodput_bytes=4096)
    assert mon.snapshot().goodput_Bps == 1234.0 and not mon.snapshot().goodput_measured
    mon.observe_probe(0.1)
    mon.observe_upload(100, 0.5, ok=True)  # too small to say anything about goodput
    assert not mon.snapshot().goodput_measured
    mon.observe_upload(100_000, 1.1, ok=True)  # 1 s of transfer after one 0.1 s round trip
    assert mon.snapshot().goodput_Bps == pytest.approx(100_000)


def test_a_stall_is_a_failure_with_a_bound_from_the_estimates():
    clock = Clock()
    mon = LinkMonitor(
        clock=clock, down_after_failures=2, prior_goodput_Bps=100_000, stall_factor=4, min_stall_s=1
    )
    suspects: list[int] = []
    mon.add_suspect_listener(lambda: suspects.append(1))
    assert mon.stall_after_s(0) == 1.0  # no round trip known yet: 4 x 0.1 s, but never under 1 s
    mon.observe_probe(0.5)
    assert mon.stall_after_s(100_000) == pytest.approx(4 * (0.5 + 1.0))  # a round trip + 1 s of transfer
    assert mon.probe_timeout_s(longest_s=2.0) == 2.0  # 4 round trips, capped by the configured timeout
    mon.uplink_in_flight(100_000)  # a probe queues behind the uplink's bytes: judged as they are
    assert mon.probe_timeout_s(longest_s=2.0) == pytest.approx(mon.stall_after_s(100_000))
    mon.uplink_in_flight(0)
    assert mon.probe_timeout_s(longest_s=2.0) == 2.0
    mon.observe_stall()
    assert mon.snapshot().state == "up" and suspects == [1]  # suspect: a prober confirms it now
    mon.observe_probe(None)
    assert mon.snapshot().state == "down"
    mon.observe_upload(10_000, 0.6, ok=True)  # the stalled request answered after all: the link is up
    assert mon.snapshot().state == "up" and mon.snapshot().consecutive_failures == 0


def test_a_returning_link_is_measured_afresh():
    """Back from an outage onto a slower link: the first round trip is believed at once and goodput
    is the prior again, not the old link's levels awaiting two confirmations."""
    clock = Clock()
    mon = LinkMonitor(clock=clock, down_after_failures=2, prior_goodput_Bps=125_000)
    for _ in range(3):
        clock.t += 1
        mon.observe_probe(0.002)
        mon.observe_upload(5_000_000, 1.0, ok=True)  # 5 MB/s, measured
    assert not mon.unsettled and mon.snapshot().goodput_Bps > 1e6
    mon.observe_probe(None)
    mon.observe_probe(None)
    assert mon.snapshot().state == "down"
    clock.t += 10
    mon.observe_probe(0.6)  # back, with a 600 ms round trip
    est = mon.snapshot()
    assert est.state == "up" and est.rtt_s == pytest.approx(0.6)
    assert est.goodput_Bps == 125_000 and not est.goodput_measured
    assert mon.unsettled and mon.estimate_restarts == 1  # probe often until 3 round trips are in
    mon.observe_upload(50_000, 1.6, ok=True)  # the first upload sets the level: ~50 kB/s
    assert mon.snapshot().goodput_Bps == pytest.approx(50_000, rel=0.01)


def test_down_after_consecutive_failures_and_up_after_one_success():
    clock = Clock()
    mon = LinkMonitor(clock=clock, down_after_failures=2)
    mon.observe_probe(0.05)
    mon.observe_probe(None)
    assert mon.snapshot().state == "up"
    clock.t = 1
    mon.observe_upload(10_000, 1.0, ok=False)
    assert mon.snapshot().state == "down" and mon.snapshot().consecutive_failures == 2
    clock.t = 3
    mon.observe_probe(0.05)
    assert mon.snapshot().state == "up"
    clock.t = 5
    assert mon.snapshot().up_fraction == pytest.approx(3 / 5)  # down from 1 to 3 of 0..5


def test_flapping_from_transitions_within_window_then_recovers():
    clock = Clock()
    mon = LinkMonitor(clock=clock, window_s=10, down_after_failures=1, flap_transitions=4)
    for _ in range(3):  # down/up three times in 6 s: 6 transitions
        clock.t += 1
        mon.observe_probe(None)
        clock.t += 1
        mon.observe_probe(0.05)
    est = mon.snapshot()
    assert est.state == "flapping" and est.transitions == 6
    assert 0.4 < est.up_fraction < 0.7
    clock.t += 11  # a quiet window later the link is simply up again
    mon.observe_probe(0.05)
    assert mon.snapshot().state == "up"


def test_view_for_planner():
    mon = LinkMonitor(clock=Clock(), prior_goodput_Bps=5000)
    view = mon.snapshot().view(default_rtt_s=0.2)
    assert view.state == "up" and view.rtt_s == 0.2 and view.goodput_Bps == 5000


def test_metrics_on_given_registry():
    registry = CollectorRegistry()
    mon = LinkMonitor(clock=Clock(), registry=registry, down_after_failures=1)
    mon.observe_probe(0.05)
    mon.observe_probe(None)
    text = generate_latest(registry).decode()
    assert "edgefed_link_rtt_seconds 0.05" in text
    assert 'edgefed_link_state{state="down"} 1.0' in text
    assert 'edgefed_link_observations_total{kind="probe",result="failed"} 1.0' in text


def test_small_upload_on_a_fast_link_is_a_lower_bound_only():
    """When the round trip is most of an upload's time, its sample says only goodput >= sample: it
    may raise the estimate, never pull it down (8 kB in 48 ms over a 40 ms RTT is not 330 kB/s)."""
    clock = Clock()
    mon = LinkMonitor(clock=clock, alpha=0.5, min_goodput_bytes=4096, large_upload_bytes=32 * 1024)
    mon.observe_probe(0.04)
    mon.observe_upload(32_768, 0.08, ok=True)  # 40 ms of transfer: ~800 kB/s, measured
    assert mon.snapshot().goodput_Bps == pytest.approx(32_768 / 0.04)
    assert mon.large_goodput_samples == 1
    before = mon.snapshot().goodput_Bps
    mon.observe_upload(8_000, 0.048, ok=True)  # censored (8 ms of 48): ignored, it is below
    assert mon.snapshot().goodput_Bps == pytest.approx(before)
    mon.observe_upload(200_000, 5.04, ok=True)  # a collapsed link: 40 kB/s, measured ...
    assert mon.snapshot().goodput_Bps == pytest.approx(before)  # ... but one could be a stalled server
    mon.observe_upload(200_000, 5.04, ok=True)  # two in a row: believed
    assert mon.snapshot().goodput_Bps < before / 2
    low = mon.snapshot().goodput_Bps
    mon.observe_upload(8_000, 0.048, ok=True)  # censored but above the estimate: taken
    assert mon.snapshot().goodput_Bps > low
    assert mon.large_goodput_samples == 3  # only uploads of >= 32 kB count as large


async def test_prober_skips_its_payload_when_real_uploads_measured_the_link():
    from gateway.placement.probe import LinkProber

    clock = Clock()
    mon = LinkMonitor(clock=clock, large_upload_bytes=32 * 1024)
    prober = LinkProber(
        mon, "http://127.0.0.1:9/healthz", goodput_url="http://127.0.0.1:9/v1/probe", payload_bytes=32 * 1024
    )
    assert prober.payload_probe_needed()  # nothing measured yet
    mon.observe_probe(0.01)
    mon.observe_upload(100_000, 0.5, ok=True)  # a real, large upload
    assert not prober.payload_probe_needed()  # it measured the link: no probe bytes
    assert prober.payload_probe_needed()  # nothing new since: probe again


def test_confirmed_level_shift_jumps_but_one_outlier_is_damped():
    clock = Clock()
    mon = LinkMonitor(clock=clock, alpha=0.3, shift_ratio=2.0)
    for _ in range(5):
        mon.observe_probe(0.04)
    mon.observe_probe(0.4)  # one slow probe: suspect, averaged in
    assert mon.snapshot().rtt_s == pytest.approx(0.7 * 0.04 + 0.3 * 0.4)
    mon.observe_probe(0.04)  # not confirmed: back to plain averaging
    assert mon.level_shifts == 0
    mon.observe_probe(0.4)
    mon.observe_probe(0.5)  # a second slow sample in a row: the link changed
    assert mon.snapshot().rtt_s == pytest.approx((0.4 * 0.5) ** 0.5)
    assert mon.level_shifts == 1


def test_goodput_rise_is_believed_after_two_samples():
    clock = Clock()
    mon = LinkMonitor(clock=clock, alpha=0.3, shift_ratio=2.0)
    mon.observe_probe(0.05)
    mon.observe_upload(40_000, 1.05, ok=True)  # 40 kB/s
    for _ in range(2):
        mon.observe_upload(800_000, 1.05, ok=True)  # 800 kB/s
    assert mon.snapshot().goodput_Bps == pytest.approx(800_000)


def test_flapping_ends_once_the_link_outlasts_its_flaps():
    clock = Clock()
    mon = LinkMonitor(clock=clock, window_s=100, down_after_failures=1, flap_transitions=4, settle_factor=1.5)
    for _ in range(3):  # 10 s up, 10 s down, three times
        clock.t += 10
        mon.observe_probe(None)
        clock.t += 10
        mon.observe_probe(0.05)
    clock.t += 14  # up for 14 s: no longer than 1.5 x the 10 s up stretches seen
    mon.observe_probe(0.05)
    assert mon.snapshot().state == "flapping"
    clock.t += 2  # up for 16 s > 15 s: settled, although the transitions are still in the window
    mon.observe_probe(0.05)
    est = mon.snapshot()
    assert est.state == "up" and est.transitions == 6


def test_suspect_listener_called_while_link_still_believed_up():
    clock = Clock()
    mon = LinkMonitor(clock=clock, down_after_failures=2)
    calls = []
    mon.add_suspect_listener(lambda: calls.append(mon.snapshot().state))
    mon.observe_probe(0.05)
    mon.observe_upload(10_000, 1.0, ok=False)  # suspect: one failure
    assert calls == ["up"]
    mon.observe_probe(None)  # confirmed: down, a transition (not a suspicion)
    mon.observe_probe(None)  # already down: nothing to confirm
    assert calls == ["up"] and mon.snapshot().state == "down"


async def test_prober_confirms_a_suspect_failure_before_its_interval():
    """A failed real upload brings the next probe forward: the outage is seen in about a second."""
    from gateway.placement.probe import LinkProber
    from tests.harness.poll import eventually

    mon = LinkMonitor(down_after_failures=2)
    prober = LinkProber(
        mon, "http://127.0.0.1:9/healthz", interval_s=60.0, timeout_s=0.5, confirm_after_s=0.05
    )
    await prober.start()
    try:
        # the first probe fails (port 9): suspect, then confirmed; a broken confirm would wait 60 s
        await eventually(lambda: mon.snapshot().state == "down", 30, "the link down", interval_s=0.01)
    finally:
        await prober.stop()
    assert prober.confirm_probes >= 1 and prober.probes >= 2


def test_a_short_down_stretch_does_not_end_flapping():
    """Settling is measured against every stretch of the flapping: down stretches seen at 4 s (a
    probe's granularity) do not make a 7 s one look like a lasting outage while ups last 10 s."""
    clock = Clock()
    mon = LinkMonitor(clock=clock, window_s=100, down_after_failures=1, flap_transitions=4, settle_factor=1.5)
    mon.observe_probe(0.05)
    for _ in range(2):
        clock.t += 10
        mon.observe_probe(None)
        clock.t += 4
        mon.observe_probe(0.05)
    clock.t += 10
    mon.observe_probe(None)
    clock.t += 7
    mon.observe_probe(None)
    assert mon.snapshot().state == "flapping"


def test_placement_config_sets_the_level_shift_ratio():
    # [placement] shift_ratio = 10: a 10x slower pair of probes is not yet a level shift.
    mon = make_monitor(PlacementConfig(shift_ratio=10.0))
    for _ in range(5):
        mon.observe_probe(0.04)
    mon.observe_probe(0.3)
    mon.observe_probe(0.3)
    assert mon.level_shifts == 0
    default = make_monitor(PlacementConfig())
    for rtt in (0.04,) * 5 + (0.3, 0.3):
        default.observe_probe(rtt)
    assert default.level_shifts == 1
