"""Stage transitions of one model name, as changes of its ``Lifecycle`` (pure: no I/O, no clock).

    promote to canary       a promotable version (not archived) -> canary on a set of gateways;
                            refused while another canary runs
    promote to production   a promotable version -> production; the old production is archived
                            (kept: a later rollback may return to it)
    rollback                the canary -> archived (if one runs); else production -> archived and
                            ``to`` (or the production before it, else the factory version) ->
                            production. Rollback targets are not gated: it is the operator's word
    set_stage               candidate/archived by hand; canary/production go through promote

Every change records one event ``{"ts", "action", "version", ..., "reason", "by"}``.

Invariant: after any change at most one version is production and at most one canary, the aliases
name exactly those, and a version that is not promotable becomes canary or production only with
``force`` (the factory version needs none: it is the product as shipped).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any, Literal

from cloud.rollout.lifecycle import Canary, Lifecycle, Stage

MAX_PREVIOUS = 20  # earlier productions kept for rollback
RefusalReason = Literal[
    "invalid",
    "not_promotable",
    "canary_running",
    "already_production",
    "no_target",
    "use_promote",
    "is_production",
]


class Refused(ValueError):
    """A transition that is not allowed; ``reason`` is a stable token, the message says why."""

    def __init__(self, reason: RefusalReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def gate_refusal(entry: dict[str, Any]) -> str | None:
    """Why ``entry`` may not run on gateways, naming its evaluation; None if it may."""
    if entry.get("factory"):
        return None
    evaluation = entry.get("evaluation")
    where = f"{entry['name']}@{entry['version']}"
    if evaluation is None:
        return f"{where} has no evaluation (uploaded by hand): only --force promotes it"
    if not evaluation["promotable"]:
        return f"{where} is not promotable: {evaluation['reason']} on {evaluation['dataset']}"
    return None


def canary_share_gateways(fleet: Sequence[str], share: float, name: str, version: str) -> list[str]:
    """ceil(share x fleet) gateways, chosen by a hash of (name, version, gateway): stable per version,
    spread across versions."""
    if not 0 < share <= 1:
        raise Refused("invalid", f"share: {share} is not in (0, 1]")
    if not fleet:
        raise Refused("invalid", "share: cloudd knows no gateways (--token) to take a share of")

    def rank(gateway: str) -> str:
        return hashlib.sha256(f"{name}\0{version}\0{gateway}".encode()).hexdigest()

    return sorted(sorted(fleet, key=rank)[: math.ceil(share * len(fleet))])


def _event(action: str, version: str | None, reason: str, by: str, now: float, **more: Any) -> dict[str, Any]:
    return {"ts": now, "action": action, "version": version, "reason": reason, "by": by, **more}


def _gated(entry: dict[str, Any], force: bool) -> dict[str, Any]:
    """Raise when the gate refuses ``entry`` and it is not forced; the event fields that say a
    refusal was overridden ({"forced": why}) or nothing."""
    refusal = gate_refusal(entry)
    if refusal is not None and not force:
        raise Refused("not_promotable", refusal)
    return {"forced": refusal} if refusal is not None else {}


def promote_canary(
    state: Lifecycle,
    entry: dict[str, Any],
    gateways: list[str],
    share: float | None,
    *,
    force: bool,
    by: str,
    now: float,
) -> None:
    version = entry["version"]
    forced = _gated(entry, force)
    if state.canary is not None and state.canary.version != version:
        raise Refused(
            "canary_running",
            f"{entry['name']}@{state.canary.version} is the canary: roll it back or promote it first",
        )
    if version == state.production:
        raise Refused("already_production", f"{entry['name']}@{version} is already production")
    if not gateways:
        raise Refused("invalid", "canary: name gateways (--canary gw1,gw2) or a share (--share 0.2)")
    state.canary = Canary(version, sorted(gateways), share, now)
    state.stages[version] = "canary"
    state.record(
        _event(
            "canary", version, "promoted to canary", by, now, gateways=sorted(gateways), share=share, **forced
        )
    )


def promote_production(
    state: Lifecycle, entry: dict[str, Any], *, force: bool, by: str, now: float, reason: str
) -> None:
    version = entry["version"]
    forced = _gated(entry, force)
    previous = state.production
    if previous == version:
        raise Refused("already_production", f"{entry['name']}@{version} is already production")
    if previous is not None:
        state.stages[previous] = "archived"
        state.previous = [*state.previous, previous][-MAX_PREVIOUS:]
    if state.canary is not None and state.canary.version == version:
        state.canary = None
    state.production = version
    state.stages[version] = "production"
    state.record(_event("production", version, reason, by, now, replaced=previous, **forced))


def rollback(
    state: Lifecycle,
    to: dict[str, Any] | None,
    factory_version: str | None,
    *,
    by: str,
    now: float,
    reason: str,
) -> str:
    """Roll back; returns the version that now runs where the rolled-back one ran."""
    if state.canary is not None and to is None:
        canary = state.canary
        state.stages[canary.version] = "archived"
        state.canary = None
        state.record(
            _event(
                "rollback",
                canary.version,
                reason,
                by,
                now,
                gateways=canary.gateways,
                now_runs=state.production,
            )
        )
        return state.production or factory_version or ""
    target = to["version"] if to is not None else _previous_production(state, factory_version)
    if target is None:
        raise Refused("no_target", "nothing to roll back to: no earlier production and no factory version")
    if target == state.production:
        raise Refused("already_production", f"{target} is already production")
    current = state.production
    if state.canary is not None:  # a rollback to a named version ends any canary too
        state.stages[state.canary.version] = "archived"
        state.canary = None
    if current is not None:
        state.stages[current] = "archived"
    state.previous = [v for v in state.previous if v != target]
    state.production = target
    state.stages[target] = "production"
    state.record(_event("rollback", current, reason, by, now, now_runs=target))
    return target


def _previous_production(state: Lifecycle, factory_version: str | None) -> str | None:
    earlier = [v for v in state.previous if v != state.production]
    if earlier:
        return earlier[-1]
    return factory_version if factory_version != state.production else None


def set_stage(state: Lifecycle, entry: dict[str, Any], stage: Stage, *, by: str, now: float) -> None:
    version = entry["version"]
    if stage in ("canary", "production"):
        raise Refused("use_promote", f"stage {stage}: use promote (it checks the gate and the canary set)")
    if version == state.production:
        raise Refused(
            "is_production", f"{entry['name']}@{version} is production: promote or roll back to another first"
        )
    if state.canary is not None and state.canary.version == version:
        state.canary = None
    state.stages[version] = stage
    state.record(_event("stage", version, f"set to {stage}", by, now, stage=stage))


def assignment(state: Lifecycle, gateway: str, factory_version: str | None) -> tuple[str, str, str] | None:
    """(version, stage, reason) that ``gateway`` should run: the canary if it is in the canary set,
    else production, else the factory version; None when the name has none of them."""
    canary = state.canary
    if canary is not None and gateway in canary.gateways:
        how = f"share {canary.share}" if canary.share is not None else "named"
        return canary.version, "canary", f"in the canary set ({how})"
    if state.production is not None:
        return state.production, "production", "production alias"
    if factory_version is not None:
        return factory_version, "production", "factory version (no production alias)"
    return None
