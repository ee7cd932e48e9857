"""The link monitor's numbers at /metrics: its estimates as gauges, its observations counted.

Invariant: ``publish`` sets every gauge from one ``LinkEstimate`` (one state label at 1, the others
at 0); the RTT gauge is the EWMA, left unset until a round trip was measured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.placement.cost import LINK_STATES

if TYPE_CHECKING:
    from gateway.placement.link import LinkEstimate


class LinkMetrics:
    """The gauges and counter of one ``LinkMonitor``, on its registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rtt = Gauge("edgefed_link_rtt_seconds", "Uplink round trip (EWMA)", registry=registry)
        self.goodput = Gauge(
            "edgefed_link_goodput_bytes_per_second", "Uplink goodput (EWMA)", registry=registry
        )
        self.up_fraction = Gauge(
            "edgefed_link_up_fraction", "Fraction of the window the link was up", registry=registry
        )
        self.transitions = Gauge(
            "edgefed_link_transitions", "Up/down transitions in the window", registry=registry
        )
        self.state = Gauge("edgefed_link_state", "1 for the current link state", ["state"], registry=registry)
        self.observations = Counter(
            "edgefed_link_observations",
            "Probes and uploads seen by the link monitor",
            ["kind", "result"],
            registry=registry,
        )

    def publish(self, est: LinkEstimate) -> None:
        if est.rtt_s is not None:
            self.rtt.set(est.rtt_s)
        self.goodput.set(est.goodput_Bps)
        self.up_fraction.set(est.up_fraction)
        self.transitions.set(est.transitions)
        for state in LINK_STATES:
            self.state.labels(state).set(1.0 if state == est.state else 0.0)
