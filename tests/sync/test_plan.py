"""The planner, pure: link fit, the iteration model, the candidates, and the engine rule using it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cloud.training.sync.barrier import LayerWindow, SyncPolicy, WindowTable
from cloud.training.sync.engine import judge
from cloud.training.sync.predict import Cost, LinkModel, best_plan, candidates, predict_iteration_s
from cloud.training.sync.rules import EngineConfig, propose

NAMES = ("0", "2", "4", "6", "8", "10", "12")
LAYER_BYTES, OUTPUT_BYTES = 2_362_368, 30_760  # the benchmark's Linear(768, 768) and Linear(768, 10)
SLOW = LinkModel(wire=Cost(0.003, 1 / 400e6), reduce=Cost(0.001, 0.5e-9))  # 400 MB/s + 3 ms a message
FAST = LinkModel(wire=Cost(0.0, 0.0), reduce=Cost(0.0001, 0.1e-9))  # 10 GB/s, 0.1 ms


def layers(
    blocked_s: float = 0.0,
    queue_s: float = 0.0,
    link: LinkModel = SLOW,
    policy: SyncPolicy = SyncPolicy.per_layer(NAMES),
) -> tuple[LayerWindow, ...]:
    """The benchmark's model (1.2 ms of forward and 2.5 ms of backward per layer) as a window
    measured under ``policy`` would show it: each layer carries its message's times."""
    sizes = dict(zip(NAMES, [LAYER_BYTES] * 6 + [OUTPUT_BYTES], strict=True))
    message = {name: sum(sizes[n] for n in policy.bucket_of(name)) for name in NAMES}
    return tuple(
        LayerWindow(
            name,
            i,
            sizes[name],
            blocked_s if name == "0" else 0.0,
            0.01,
            queue_s,
            wire_s=link.wire(message[name]),
            reduce_s=link.reduce(message[name]),
            forward_s=0.0012,
            ready_s=(len(NAMES) - 1 - i) * 0.0025,
        )
        for i, name in enumerate(NAMES)
    )


def test_cost_fit_recovers_a_link_and_refuses_one_size() -> None:
    link = Cost(0.003, 2.5e-9)
    fitted = Cost.fit((size, link(size)) for size in (30_000, 2_000_000, 4_000_000))
    assert (fitted.fixed_s, fitted.per_byte_s) == pytest.approx((link.fixed_s, link.per_byte_s))
    assert Cost.fit([(1000, 0.001), (1000, 0.002)]) is None  # one size: fixed and per-byte cost inseparable
    assert Cost.fit([(1000, 0.002), (2000, 0.001)]) == Cost(0.0015, 0.0)  # noise: no negative cost per byte


def test_slow_link_prefers_fewer_messages_with_the_first_layers_first() -> None:
    window = layers()
    per_layer = SyncPolicy.per_layer(NAMES)
    plan = best_plan(window, per_layer, SLOW)
    assert plan.predicted_s < plan.current_s * 0.95
    assert 2 <= len(plan.policy.buckets) < len(NAMES)  # merged, but not into one message
    assert "0" in plan.policy.first and "0" in plan.policy.held  # the first-needed layer first
    one_message = SyncPolicy((tuple(reversed(NAMES)),))
    assert predict_iteration_s(one_message, window, SLOW) > plan.predicted_s  # no overlap with backward


def test_fast_link_keeps_per_layer_messages() -> None:
    window = layers(link=FAST)
    per_layer = SyncPolicy.per_layer(NAMES)
    plan = best_plan(window, per_layer, FAST)
    assert plan.predicted_s == pytest.approx(plan.current_s, rel=0.02)
    # with nothing on the wire the iteration is backward + forward compute
    assert plan.current_s == pytest.approx(0.015 + 7 * 0.0012, rel=0.05)


def test_candidates_are_valid_policies_over_the_same_layers() -> None:
    policies = candidates(layers())
    assert SyncPolicy.per_layer(NAMES) in policies
    assert len({policy.text() for policy in policies}) == len(policies)
    for policy in policies:
        policy.validate(NAMES)  # every layer exactly once: still synchronous SGD


def test_engine_tries_the_plan_on_a_backlog_and_falls_back_without_timings() -> None:
    window = WindowTable(0, 4, 0.07, "", layers(blocked_s=0.02, queue_s=0.01))
    proposal = propose(window, SyncPolicy.per_layer(NAMES))
    assert proposal.policy != SyncPolicy.per_layer(NAMES) and proposal.reason.startswith("planner")
    measured = WindowTable(1, 4, 0.06, "", layers(blocked_s=0.01, queue_s=0.01, policy=proposal.policy))
    settled = propose(measured, proposal.policy, link=SLOW)  # the same link: nothing predicted better
    assert settled.policy == proposal.policy and "no candidate" in settled.reason
    untimed = WindowTable(0, 4, 0.07, "", tuple(replace(layer, forward_s=0.0) for layer in window.layers))
    fallback = propose(untimed, SyncPolicy.per_layer(NAMES))
    assert not fallback.reason.startswith("planner")
    rules_only = propose(window, SyncPolicy.per_layer(NAMES), EngineConfig(plan=False))
    assert not rules_only.reason.startswith("planner")


def test_a_window_of_one_message_size_plans_with_the_link_known_from_before() -> None:
    """Equal layers sent one per message cannot separate a link's fixed and per-byte cost; the
    engine passes the model it fitted in an earlier window."""
    wire, reduce = SLOW.wire(LAYER_BYTES), SLOW.reduce(LAYER_BYTES)
    equal = tuple(
        replace(layer, nbytes=LAYER_BYTES, wire_s=wire, reduce_s=reduce)
        for layer in layers(blocked_s=0.02, queue_s=0.01)
    )
    window = WindowTable(0, 4, 0.07, "", equal)
    assert not propose(window, SyncPolicy.per_layer(NAMES)).reason.startswith("planner")
    assert propose(window, SyncPolicy.per_layer(NAMES), link=SLOW).reason.startswith("planner")


def test_link_model_median_is_taken_term_by_term() -> None:
    fits = [
        LinkModel(Cost(0.003, 2.5e-9), Cost(0.004, 0.0)),
        LinkModel(Cost(0.0031, 2.4e-9), Cost(0.0, 1e-9)),
        LinkModel(Cost(0.0029, 2.6e-9), Cost(0.001, 0.2e-9)),
    ]
    median = LinkModel.median(fits)
    assert median == LinkModel(Cost(0.003, 2.5e-9), Cost(0.001, 0.2e-9))


def test_a_plan_is_judged_on_iteration_time_not_blocked_time() -> None:
    """Two big messages block the forward less than four and still take longer per iteration."""
    before = WindowTable(1, 4, 0.0625, "", layers(blocked_s=0.030))
    after = WindowTable(2, 4, 0.0660, "", layers(blocked_s=0.025))
    assert judge(before, after).keep  # as a remedy: blocked time fell
    verdict = judge(before, after, kind="plan")
    assert not verdict.keep and verdict.measure == "iteration"
