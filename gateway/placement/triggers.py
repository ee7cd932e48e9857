"""When the planner evaluates its placement again: pure functions of the link it last evaluated
with (the *basis*) and the link now.

Invariant: a trigger is a reason as text, or None; nothing here has state.
- ``replan_trigger``: the link state changed, or an estimate left the hysteresis band around the
  basis (round trip, goodput, up fraction; ``Hysteresis``).
- ``settle_trigger``: an up link back from down started or ended settling (``cost.drop_risk``);
  the end of settling changes no estimate, so it is a trigger of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.placement.cost import Budgets, LinkView, drop_risk


def kB_s(x: float) -> str:
    """Bytes per second as the planner's reasons and triggers write them."""
    return f"{x / 1000:.1f} kB/s"


@dataclass(frozen=True)
class Hysteresis:
    """Re-plan when an estimate leaves the band around the one the plan was made with."""

    rtt_ratio: float = 1.5  # re-plan if rtt grows or shrinks by more than this factor ...
    rtt_floor_s: float = 0.02  # ... and by more than this many seconds (loopback jitter is not news)
    goodput_ratio: float = 1.5
    up_fraction_delta: float = 0.2
    switch_gain: float = 0.05  # a move must gain this much score (latency / target units) in one state


def replan_trigger(basis: LinkView, now: LinkView, band: Hysteresis) -> str | None:
    """Why ``now`` calls for a new plan made at ``basis``; None while it stays in the band."""
    if now.state != basis.state:
        return f"link {basis.state}->{now.state}"
    if now.state == "down":
        return None
    if (
        abs(now.rtt_s - basis.rtt_s) > band.rtt_floor_s
        and not basis.rtt_s / band.rtt_ratio <= now.rtt_s <= basis.rtt_s * band.rtt_ratio
    ):
        return f"rtt {basis.rtt_s * 1000:.1f}->{now.rtt_s * 1000:.1f} ms (band x{band.rtt_ratio:g})"
    if (
        not basis.goodput_Bps / band.goodput_ratio
        <= now.goodput_Bps
        <= basis.goodput_Bps * band.goodput_ratio
    ):
        return f"goodput {kB_s(basis.goodput_Bps)}->{kB_s(now.goodput_Bps)} (band x{band.goodput_ratio:g})"
    if abs(now.up_fraction - basis.up_fraction) > band.up_fraction_delta:
        return f"up fraction {basis.up_fraction:.0%}->{now.up_fraction:.0%}"
    return None


def settle_trigger(basis: LinkView, now: LinkView, budgets: Budgets) -> str | None:
    """Why ``now`` calls for a new evaluation as a returning link settles (``cost.drop_risk``), the
    link up at both: a plan made while it settled priced the cloud with the risk of a drop, and the
    end of that time changes no estimate, so it is a trigger of its own. (A return is a change of
    state, already a trigger.)"""
    if not basis.state == now.state == "up":
        return None
    before, after = drop_risk(basis, budgets) > 0, drop_risk(now, budgets) > 0
    if before and not after:
        return f"link settled (up {now.up_for_s:.1f} s after a down stretch of {now.longest_down_s:.1f} s)"
    if after and not before:
        return f"link settling (back {now.up_for_s:.1f} s after a down stretch of {now.longest_down_s:.1f} s)"
    return None
