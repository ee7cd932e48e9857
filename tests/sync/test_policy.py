"""The policy engine, pure: no torch.distributed."""

from __future__ import annotations

from cloud.training.sync.barrier import LayerWindow, SyncPolicy, WindowTable
from cloud.training.sync.engine import PolicyEngine, judge
from cloud.training.sync.rules import EngineConfig, propose

ORDER = ("0", "2", "4", "6")
KB = 1024
NO_WARMUP = EngineConfig(warmup_windows=0)  # these tables are steady-state windows from the start


def table(window: int, blocked: dict[str, float], sync: dict[str, float], policy: str = "") -> WindowTable:
    layers = tuple(
        LayerWindow(name, i, 64 * KB, blocked.get(name, 0.0), sync.get(name, 0.001))
        for i, name in enumerate(ORDER)
    )
    return WindowTable(window, 4, 0.05, policy, layers)


def test_text_round_trip_and_validation() -> None:
    policy = SyncPolicy((("6",), ("4", "2"), ("0",)), held=frozenset({"6"}), first=frozenset({"0"}))
    assert policy.text() == "6|4+2|0 first=0 held=6"
    assert SyncPolicy.parse(policy.text()) == policy
    policy.validate(ORDER)
    assert SyncPolicy.per_layer(ORDER).text() == "6|4|2|0"
    try:
        SyncPolicy.parse("6|4|0").validate(ORDER)
    except ValueError as error:
        assert "exactly once" in str(error)
    else:
        raise AssertionError("a policy missing a layer must not validate")


def test_blocked_layer_behind_heavy_sync_is_sent_first() -> None:
    default = SyncPolicy.per_layer(ORDER)
    proposal = propose(table(0, {"0": 0.08}, {"6": 0.1}), default)
    assert proposal.policy.first == {"0", "2", "4"}
    assert "behind heavy sync of 6" in proposal.reason


def test_nothing_blocked_keeps_policy_and_heavy_gone_releases() -> None:
    default = SyncPolicy.per_layer(ORDER)
    assert propose(table(0, {}, {}), default).policy == default
    sent_first = SyncPolicy(default.buckets, first=frozenset({"0"}))
    assert propose(table(0, {}, {}), sent_first).policy == default


def test_tabu_falls_back_to_hold_then_merge() -> None:
    default = SyncPolicy.per_layer(ORDER)
    blocked = table(0, {"0": 0.08}, {"6": 0.1})
    first_try = propose(blocked, default).policy
    hold = propose(blocked, default, tabu=frozenset({first_try.text()})).policy
    assert hold.held == {"6"} and not hold.first
    merged = propose(
        blocked, default, EngineConfig(merge_bytes=1 << 20), tabu=frozenset({first_try.text(), hold.text()})
    ).policy
    assert len(merged.buckets) == len(ORDER) - 1


def test_judge_keeps_improvement_and_reverts_regression() -> None:
    before = table(0, {"0": 0.05}, {})
    assert judge(before, table(1, {"0": 0.01}, {})).keep
    assert not judge(before, table(1, {"0": 0.09}, {})).keep


def test_engine_try_keep_then_release_when_delay_goes() -> None:
    engine = PolicyEngine(SyncPolicy.per_layer(ORDER), NO_WARMUP)
    engine.end_window(table(0, {"0": 0.08}, {"6": 0.1}))
    assert engine.policy.first and engine.decisions[-1]["action"] == "try"
    engine.end_window(table(1, {"6": 0.02}, {"6": 0.1}))
    assert engine.decisions[-1]["action"] == "keep" and engine.policy.first
    engine.end_window(table(2, {}, {}))  # delay gone: the sync is no longer heavy
    assert engine.decisions[-1]["action"] == "try" and "release" in engine.decisions[-1]["reason"]
    engine.end_window(table(3, {}, {}))
    assert engine.policy == SyncPolicy.per_layer(ORDER)


def test_warmup_window_is_measured_but_not_decided_on() -> None:
    engine = PolicyEngine(SyncPolicy.per_layer(ORDER))
    assert engine.end_window(table(0, {"0": 0.08}, {"6": 0.1})) == SyncPolicy.per_layer(ORDER)
    assert not engine.decisions
    engine.end_window(table(1, {"0": 0.08}, {"6": 0.1}))
    assert engine.decisions[-1]["action"] == "try"


def test_engine_reverts_a_trial_that_made_things_worse() -> None:
    engine = PolicyEngine(SyncPolicy.per_layer(ORDER), NO_WARMUP)
    engine.end_window(table(0, {"0": 0.08}, {"6": 0.1}))
    engine.end_window(table(1, {"0": 0.2}, {"6": 0.1}))
    assert engine.decisions[-1]["action"] == "revert"
    assert engine.policy == SyncPolicy.per_layer(ORDER)


def queued_table(
    window: int, blocked: dict[str, float], queue: dict[str, float], sync: float = 0.008
) -> WindowTable:
    layers = tuple(
        LayerWindow(name, i, 64 * KB, blocked.get(name, 0.0), sync, queue.get(name, 0.0))
        for i, name in enumerate(ORDER)
    )
    return WindowTable(window, 4, 0.05, "", layers)


def test_backlog_sends_first_needed_layers_first_in_forward_order_then_releases() -> None:
    """A link slower than backward: no single sync heavy, but layer 0 queues behind the others."""
    engine = PolicyEngine(SyncPolicy.per_layer(ORDER), EngineConfig(merge_bytes=0, warmup_windows=0))
    engine.end_window(queued_table(0, {"0": 0.03}, {"0": 0.025, "2": 0.015}))
    assert engine.policy.first == engine.policy.held == {"0"}
    assert "forward order" in engine.decisions[-1]["reason"]
    engine.end_window(queued_table(1, {"2": 0.02}, {"2": 0.02}))  # kept; now layer 2 waits: double
    assert engine.decisions[-2]["action"] == "keep"
    assert engine.policy.first == engine.policy.held == {"0", "2"}
    engine.end_window(queued_table(2, {"4": 0.005}, {"4": 0.01}))
    assert engine.policy.first == {"0", "2", "4"}  # capped: the last-needed layer keeps overlapping
    engine.end_window(queued_table(3, {}, {}, sync=0.0005))  # the link got fast: no backlog left
    assert engine.decisions[-1]["action"] == "try" and "release" in engine.decisions[-1]["reason"]
    engine.end_window(queued_table(4, {}, {}, sync=0.0005))
    assert engine.policy == SyncPolicy.per_layer(ORDER)


def test_blocked_without_queueing_is_not_a_backlog() -> None:
    """Rank skew blocks layer 0 but its message did not wait behind others: not the backlog rule."""
    proposal = propose(
        queued_table(0, {"0": 0.03}, {"0": 0.001}), SyncPolicy.per_layer(ORDER), EngineConfig(merge_bytes=0)
    )
    assert proposal.policy == SyncPolicy.per_layer(ORDER)


def test_backlog_rule_looks_past_a_layer_already_sent_first() -> None:
    """Layer 0 (already first) still waits for its own message; layer 2 queues behind the backlog."""
    current = SyncPolicy(SyncPolicy.per_layer(ORDER).buckets, held=frozenset({"0"}), first=frozenset({"0"}))
    window = queued_table(0, {"0": 0.06, "2": 0.02}, {"2": 0.02})
    proposal = propose(window, current, EngineConfig(merge_bytes=0))
    assert proposal.policy.first == proposal.policy.held == {"0", "2"}


def test_merge_cap_comes_from_the_measured_link() -> None:
    """A 30 KB message costs nearly a whole round trip; 2.3 MB ones are mostly transfer: merge the
    small one (sizes and times from the benchmark's link), never two big ones."""
    sizes = {"0": 2300 * KB, "2": 2300 * KB, "4": 2300 * KB, "6": 30 * KB}
    sync = {name: 0.016 + size * 6e-9 for name, size in sizes.items()}
    layers = tuple(
        LayerWindow(name, i, sizes[name], 0.03 if name == "0" else 0.0, sync[name])
        for i, name in enumerate(ORDER)
    )
    window = WindowTable(0, 4, 0.2, "", layers)
    proposal = propose(window, SyncPolicy.per_layer(ORDER))
    assert proposal.policy.buckets == (("6", "4"), ("2",), ("0",)), proposal.reason
    again = propose(window, proposal.policy)  # the merged bucket and the next are both big
    assert again.policy == proposal.policy
    assert (
        propose(window, SyncPolicy.per_layer(ORDER), EngineConfig(merge_bytes=0)).policy.buckets
        == SyncPolicy.per_layer(ORDER).buckets
    )
