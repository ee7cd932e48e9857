"""LinkMonitor with an injected clock: EWMA/window estimates, availability states, metrics."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.placement.link import LinkMonitor


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
