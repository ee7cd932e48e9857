"""What the policy engine tries next: ``propose(table, policy)`` reads one measured window's
per-layer table and returns the barrier policy to try with its reason, or keeps the current one.

The rules are data: an ordered list of small functions over one ``_Window`` of shared facts, each
returning a ``Proposal`` or None; the first that proposes wins (``_RULES``). Pure: no clock, no
torch. ``engine.py`` judges the trial and strings the two together.

Invariant: every proposal is a ``SyncPolicy`` over the same layers as the table, and none repeats a
policy the caller marked tabu.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from cloud.training.sync.barrier import LayerWindow, SyncPolicy, WindowTable
from cloud.training.sync.predict import Cost, LinkModel, best_plan


@dataclass(frozen=True)
class EngineConfig:
    block_threshold_s: float = 0.002  # a layer blocked less than this per iteration is fine
    heavy_factor: float = 3.0  # a sync is heavy when it takes this many times the median sync...
    heavy_min_s: float = 0.004  # ...and at least this long
    # An ordinary bucket this small or smaller may be merged with its neighbour. None sizes it from
    # the window: the bytes whose transfer takes as long as one message's fixed cost on the measured
    # link (fit sync = a + b * bytes over the buckets), i.e. a message that is mostly round trip;
    # merging it saves that round trip and delays little. 0 disables merging.
    merge_bytes: int | None = None
    keep_rel_tol: float = 0.10  # keep a trial unless blocked time grew by more than this fraction...
    keep_abs_tol_s: float = 0.001  # ...plus this absolute slack (noise on a shared box)
    # A trial that releases (moves back towards the plain policy) is kept unless clearly worse: with
    # the cause gone, the simpler policy wins ties, and noise must not pin a stale remedy in place.
    release_rel_tol: float = 0.5
    # A layer blocked while its message sat at least this long in the lane behind messages of layers
    # the next forward needs later is queued behind a backlog: send the first-needed layers first.
    backlog_min_s: float = 0.004
    # The planner (rule 4; False: the rules only) proposes a policy only if its predicted iteration
    # is this much shorter than the current policy's, and its trial is kept only if the measured
    # mean iteration grew by no more than plan_rel_tol (+ keep_abs_tol_s): a predicted gain that
    # does not show is a model error, and a kept one would never be revisited (the model keeps
    # predicting it).
    plan: bool = True
    plan_min_gain: float = 0.05
    plan_rel_tol: float = 0.0
    # A reverted policy is not proposed again for this many windows, doubled at each further revert
    # of the same policy, so a remedy that keeps failing costs ever fewer trial windows.
    tabu_windows: int = 4
    # Windows measured but not decided on: the first iterations set up the process groups'
    # connections and the allocator's pools, and run many times slower than the rest.
    warmup_windows: int = 1


ProposalKind = Literal["remedy", "release", "plan"]


@dataclass(frozen=True)
class Proposal:
    policy: SyncPolicy
    reason: str
    # how the trial is judged: "remedy" (keep_rel_tol), "release" (undoes a remedy: release_rel_tol)
    # or "plan" (the planner predicted a gain: plan_rel_tol)
    kind: ProposalKind = "remedy"


def _heavy_cut(table: WindowTable, cfg: EngineConfig) -> float:
    median = statistics.median(layer.sync_s for layer in table.layers)
    return max(cfg.heavy_min_s, cfg.heavy_factor * median)


def propose(
    table: WindowTable,
    current: SyncPolicy,
    cfg: EngineConfig = EngineConfig(),
    tabu: frozenset[str] = frozenset(),
    link: LinkModel | None = None,
) -> Proposal:
    """The policy to try for the next window, from this window's table. Pure.

    Rules (``_RULES``), first match wins; each rule's docstring says when it fires and what it
    proposes: (1) release held layers whose sync is no longer heavy; (2) release the priority lane,
    and the layers sent first in forward order, once their cause is gone; if no layer is blocked,
    keep the current policy; (3) send a layer blocked behind a heavy sync first, or hold the heavy
    syncs; (4) the planner's policy; (5) send the first-needed layers first, in forward order, when
    a backlog of syncs needed later delays them; (6) merge two small adjacent buckets; otherwise
    keep the current policy. Policies in ``tabu`` (text form) are never proposed. ``link``: the
    planner's link model (by default fitted to this window's messages).
    """
    forward_index = {layer.name: layer.forward_index for layer in table.layers}
    window = _Window(
        table,
        current,
        cfg,
        tabu,
        link,
        by_name={layer.name: layer for layer in table.layers},
        heavy=_heavy_cut(table, cfg),
        ordered=current.held & current.first,
        main_lane=[name for bucket in current.main_lane_order(forward_index) for name in bucket],
        worst=max(table.layers, key=lambda layer: layer.blocked_s),
    )
    for rule in _RULES:
        proposal = rule(window)
        if proposal is not None:
            return proposal
    worst = window.worst
    return Proposal(current, f"{worst.name} blocked {worst.blocked_s * 1e3:.1f} ms; no untried remedy")


@dataclass(frozen=True)
class _Window:
    """What the rules read: one window's table, the policy it ran under, and what follows from them."""

    table: WindowTable
    current: SyncPolicy
    cfg: EngineConfig
    tabu: frozenset[str]
    link: LinkModel | None
    by_name: dict[str, LayerWindow]
    heavy: float  # a sync this long or longer is heavy
    ordered: frozenset[str]  # the backlog remedy: first-needed layers, held, in forward order
    main_lane: list[str]  # the ordinary lane's layers, in launch order
    worst: LayerWindow  # the most blocked layer

    def untried(self, policy: SyncPolicy) -> bool:
        return policy.text() not in self.tabu


def _release_held(w: _Window) -> Proposal | None:
    """Rule (1): release held layers (not the backlog remedy's) whose sync is no longer heavy."""
    released = frozenset(name for name in w.current.held - w.ordered if w.by_name[name].sync_s < w.heavy)
    if not released:
        return None
    candidate = replace(w.current, held=w.current.held - released)
    if not w.untried(candidate):
        return None
    names = ",".join(sorted(released))
    return Proposal(candidate, f"release {names}: sync below {w.heavy * 1e3:.1f} ms", kind="release")


def _release_priority_lane(w: _Window) -> Proposal | None:
    """Rule (2), first half: release the priority lane (layers sent first, not in forward order)
    when no heavy sync is left on the main lane."""
    first_only = w.current.first - w.ordered
    if not first_only or any(w.by_name[name].sync_s >= w.heavy for name in w.main_lane):
        return None
    candidate = replace(w.current, first=w.ordered)
    if not w.untried(candidate):
        return None
    return Proposal(
        candidate,
        f"release first={','.join(sorted(first_only))}: no heavy sync left "
        f"on the main lane (all below {w.heavy * 1e3:.1f} ms)",
        kind="release",
    )


def _release_forward_order(w: _Window) -> Proposal | None:
    """Rule (2), second half: release the layers sent first in forward order when the link no
    longer carries a backlog (all syncs together below ``backlog_min_s``)."""
    total_sync = sum(layer.sync_s for layer in w.table.layers)
    if not (w.ordered and total_sync < w.cfg.backlog_min_s):
        return None
    candidate = replace(w.current, first=w.current.first - w.ordered, held=w.current.held - w.ordered)
    if not w.untried(candidate):
        return None
    return Proposal(
        candidate,
        f"release {','.join(sorted(w.ordered))} from forward order: syncs total "
        f"{total_sync * 1e3:.1f} ms, no backlog",
        kind="release",
    )


def _nothing_blocked(w: _Window) -> Proposal | None:
    """No layer waited long enough to need a remedy: keep the current policy."""
    if w.worst.blocked_s < w.cfg.block_threshold_s:
        return Proposal(w.current, "no layer blocked")
    return None


def _unblock_behind_heavy(w: _Window) -> Proposal | None:
    """Rule (3): if the most blocked layer queued behind a heavy sync that the next forward needs
    later, send it (and the layers queued with it) first, on the priority lane, or, if that was
    tried and reverted, hold the heavy syncs behind the barrier."""
    worst = w.worst
    worst_bucket = w.current.bucket_of(worst.name)
    if w.current.bucket_first(worst_bucket):
        return None
    ahead = w.main_lane[: w.main_lane.index(worst_bucket[0])]
    culprits = sorted(
        name
        for name in ahead
        if w.by_name[name].forward_index > worst.forward_index and w.by_name[name].sync_s >= w.heavy
    )
    if not culprits:
        return None
    # every ordinary-lane layer queued behind a culprit that the next forward needs before it
    cut = min(w.main_lane.index(name) for name in culprits)
    latest = max(w.by_name[name].forward_index for name in culprits)
    urgent = frozenset(
        name
        for name in w.main_lane[cut + 1 :]
        if w.by_name[name].forward_index < latest and name not in culprits
    )
    candidate = replace(w.current, first=w.current.first | urgent | {worst.name})
    if w.untried(candidate):
        sent = ",".join(sorted(candidate.first - w.current.first))
        return Proposal(
            candidate,
            f"send {sent} first ({worst.name} blocked "
            f"{worst.blocked_s * 1e3:.1f} ms behind heavy sync of "
            f"{','.join(culprits)})",
        )
    candidate = replace(w.current, held=w.current.held | frozenset(culprits))
    if w.untried(candidate):
        return Proposal(
            candidate,
            f"hold {','.join(culprits)} (heavy sync) behind the barrier so "
            f"{worst.name} (blocked {worst.blocked_s * 1e3:.1f} ms) "
            "goes before them",
        )
    return None


def _plan(w: _Window) -> Proposal | None:
    """Rule (4), when ``cfg.plan``: if the window measured what the planner models an iteration
    from (per-layer forward and gradient-ready times) and a link model is known, the candidate with
    the shortest predicted iteration, if it beats the current policy's prediction by
    ``plan_min_gain``; else keep the current policy (the planner weighs grouping and sending order
    together, which rules 5 and 6 only approach one step at a time). None (fall back to the rules)
    when the planner is off or the window cannot be modelled."""
    table, current, cfg = w.table, w.current, w.cfg
    link = (w.link or LinkModel.fit(table.layers, current)) if cfg.plan else None
    if link is None or not all(layer.forward_s > 0 for layer in table.layers):
        return None
    plan = best_plan(table.layers, current, link, w.tabu)
    if plan.policy == current or plan.predicted_s > plan.current_s * (1 - cfg.plan_min_gain):
        return Proposal(
            current,
            f"planner: no candidate predicted {cfg.plan_min_gain:.0%} faster than "
            f"{plan.current_s * 1e3:.1f} ms/iter",
        )
    return Proposal(
        plan.policy,
        f"planner: predicted {plan.current_s * 1e3:.1f} -> "
        f"{plan.predicted_s * 1e3:.1f} ms/iter (link: {link})",
        kind="plan",
    )


def _send_first_in_forward_order(w: _Window) -> Proposal | None:
    """Rule (5): if a main-lane layer is blocked while its message queued behind a backlog of syncs
    the next forward needs later (no single one heavy: a link slower than backward), send the
    first-needed layers first, up to it at least: held to the end of backward and launched in
    forward order on the priority lane (P3, ByteScheduler), doubling how many per trial."""
    layers, current = w.table.layers, w.current
    queued = [
        layer
        for layer in layers
        if layer.name in w.main_lane
        and layer.blocked_s >= w.cfg.block_threshold_s
        and layer.queue_s >= w.cfg.backlog_min_s
    ]
    if not queued:
        return None
    worst = max(queued, key=lambda layer: layer.blocked_s)
    ahead = w.main_lane[: w.main_lane.index(worst.name)]
    if not any(w.by_name[name].forward_index > worst.forward_index for name in ahead):
        return None
    # at least up to the blocked layer; doubling so a deep backlog is covered in a few trials; never
    # every layer (the last-needed ones keep overlapping with backward)
    count = min(max(worst.forward_index + 1, 2 * len(w.ordered)), len(layers) - 1)
    chosen = frozenset(layer.name for layer in layers if layer.forward_index < count)
    candidate = replace(current, first=current.first | chosen, held=current.held | chosen)
    if candidate == current or not w.untried(candidate):
        return None
    added = ",".join(sorted(chosen - w.ordered, key=lambda name: w.by_name[name].forward_index))
    return Proposal(
        candidate,
        f"send {added} first, in forward order ({worst.name} blocked "
        f"{worst.blocked_s * 1e3:.1f} ms, queued {worst.queue_s * 1e3:.1f} ms "
        "behind syncs needed later)",
    )


def merge_cap(table: WindowTable, current: SyncPolicy, cfg: EngineConfig) -> int:
    """Largest bucket worth merging: ``cfg.merge_bytes``, or the measured link's latency-bandwidth
    product (fixed cost / cost per byte) from a least-squares fit over this window's buckets."""
    if cfg.merge_bytes is not None:
        return cfg.merge_bytes
    by_name = {layer.name: layer for layer in table.layers}
    points = [
        (sum(by_name[n].nbytes for n in bucket), statistics.mean(by_name[n].sync_s for n in bucket))
        for bucket in current.buckets
    ]
    fit = Cost.fit(points)
    if fit is None or fit.fixed_s <= 0 or fit.per_byte_s <= 0:
        return 0  # one message size (fixed cost and cost per byte cannot be told apart), or noise
    return int(fit.fixed_s / fit.per_byte_s)


def _merge_smallest(w: _Window) -> Proposal | None:
    """Rule (6): merge the two smallest adjacent ordinary buckets of which one is within the merge
    cap (``merge_cap``: a message that is mostly round trip on the measured link)."""
    current, by_name, cap = w.current, w.by_name, merge_cap(w.table, w.current, w.cfg)

    def size(bucket: tuple[str, ...]) -> int:
        return sum(by_name[name].nbytes for name in bucket)

    pairs = []
    for i in range(len(current.buckets) - 1):
        first, second = current.buckets[i], current.buckets[i + 1]
        if any(current.bucket_held(b) or current.bucket_first(b) for b in (first, second)):
            continue
        if min(size(first), size(second)) <= cap:
            pairs.append((size(first) + size(second), i))
    for _, i in sorted(pairs):
        pair = current.buckets[i] + current.buckets[i + 1]
        buckets = current.buckets[:i] + (pair,) + current.buckets[i + 2 :]
        candidate = replace(current, buckets=buckets)
        if w.untried(candidate):
            return Proposal(
                candidate,
                f"merge {'+'.join(buckets[i])} into one message "
                f"({size(pair) / 2**20:.2f} MiB; cap {cap / 2**20:.2f} MiB)",
            )
    return None


# First match wins; the order is the rules' priority (see ``propose``).
_RULES: tuple[Callable[[_Window], Proposal | None], ...] = (
    _release_held,
    _release_priority_lane,
    _release_forward_order,
    _nothing_blocked,
    _unblock_behind_heavy,
    _plan,
    _send_first_in_forward_order,
    _merge_smallest,
)
