"""Plans and decisions as values: what runs where, what it should cost, and why.

Invariant: a ``Plan`` is immutable and self-describing: every task of every planned service has
exactly one side, and its text form (``to_text``) and JSON form (``to_dict``) carry the link
estimate it was made with and the reasons, so a published plan can be understood on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.placement.cost import LinkView
from gateway.taskgraphs.graph import Side


@dataclass(frozen=True)
class ServicePlan:
    name: str
    priority: int
    target_s: float
    latency_s: float | None  # None: the link is down, results wait in the log
    edge_cpu: float  # cores
    uplink_Bps: float
    placement: tuple[tuple[str, Side], ...]  # (task, side) in topological order

    @property
    def meets_target(self) -> bool | None:
        return None if self.latency_s is None else self.latency_s <= self.target_s

    def side(self, task: str) -> Side:
        for name, side in self.placement:
            if name == task:
                return side
        raise KeyError(f"{self.name} has no task {task!r}")


@dataclass(frozen=True)
class Plan:
    version: int
    made_at: float
    link: LinkView
    method: str  # exact | descent | link-down (and per-service heuristic, if used, in reasons)
    services: tuple[ServicePlan, ...]
    edge_utilisation: float
    uplink_Bps: float
    uplink_limit_Bps: float
    reasons: tuple[str, ...]

    def __post_init__(self) -> None:
        for s in self.services:
            names = [t for t, _ in s.placement]
            assert len(names) == len(set(names)), f"{s.name}: a task placed twice"

    def service(self, name: str) -> ServicePlan:
        for s in self.services:
            if s.name == name:
                return s
        raise KeyError(f"plan has no service {name!r}")

    def side(self, service: str, task: str) -> Side:
        return self.service(service).side(task)

    def placement_key(self) -> tuple[tuple[str, tuple[tuple[str, Side], ...]], ...]:
        return tuple((s.name, s.placement) for s in self.services)

    def to_text(self) -> str:
        link = self.link
        lines = [
            f"plan v{self.version} at {self.made_at:.3f} method={self.method} link={link.state} "
            f"rtt={link.rtt_s * 1000:.1f}ms goodput={link.goodput_Bps / 1000:.1f}kB/s "
            f"up={link.up_fraction:.0%} edge_cpu={self.edge_utilisation:.2f} "
            f"uplink={self.uplink_Bps / 1000:.2f}/{self.uplink_limit_Bps / 1000:.1f}kB/s"
        ]
        for s in self.services:
            tasks = " ".join(f"{t}@{side}" for t, side in s.placement)
            lat = "waits-for-link" if s.latency_s is None else f"{s.latency_s:.3f}s"
            verdict = {True: "ok", False: "MISS", None: "-"}[s.meets_target]
            lines.append(f"  {s.name} p{s.priority}: {tasks}  latency={lat} target={s.target_s:g}s {verdict}")
        lines.extend(f"  reason: {r}" for r in self.reasons)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "made_at": self.made_at,
            "method": self.method,
            "link": {
                "state": self.link.state,
                "rtt_s": self.link.rtt_s,
                "goodput_Bps": self.link.goodput_Bps,
                "up_fraction": self.link.up_fraction,
            },
            "edge_utilisation": self.edge_utilisation,
            "uplink_Bps": self.uplink_Bps,
            "uplink_limit_Bps": self.uplink_limit_Bps,
            "reasons": list(self.reasons),
            "services": [
                {
                    "name": s.name,
                    "priority": s.priority,
                    "target_s": s.target_s,
                    "latency_s": s.latency_s,
                    "meets_target": s.meets_target,
                    "placement": dict(s.placement),
                }
                for s in self.services
            ],
        }


@dataclass(frozen=True)
class Decision:
    """One re-plan: when, why it was triggered, which tasks moved, and the plan's reasons."""

    at: float
    version: int
    trigger: str
    link_state: str
    moves: tuple[str, ...]  # "camera/infer cloud->edge"
    reasons: tuple[str, ...]
    placement: tuple[str, ...] = ()  # every task after the decision: "camera/infer@edge"

    def to_text(self) -> str:
        moved = ", ".join(self.moves) if self.moves else "no task moved"
        return f"[{self.at:.3f}] v{self.version} link={self.link_state} trigger: {self.trigger}; {moved}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "version": self.version,
            "trigger": self.trigger,
            "link_state": self.link_state,
            "moves": list(self.moves),
            "reasons": list(self.reasons),
            "placement": list(self.placement),
        }


def placement_strings(plan: Plan) -> tuple[str, ...]:
    return tuple(f"{s.name}/{t}@{side}" for s in plan.services for t, side in s.placement)


def moves_between(old: Plan | None, new: Plan) -> tuple[str, ...]:
    if old is None:
        return ()
    before = {(s.name, t): side for s in old.services for t, side in s.placement}
    return tuple(
        f"{s.name}/{t} {before[(s.name, t)]}->{side}"
        for s in new.services
        for t, side in s.placement
        if (s.name, t) in before and before[(s.name, t)] != side
    )
