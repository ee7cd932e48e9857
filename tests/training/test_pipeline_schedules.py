"""Schedules as data: build, print/parse, validate, simulate (no torch.distributed)."""

from __future__ import annotations

import random

import pytest

from cloud.training.schedules import (
    SCHEDULE_NAMES,
    Action,
    Schedule,
    ScheduleError,
    build_schedule,
    parse_orders,
    predicted_bubble,
    simulate,
    validate,
)


def test_action_text_round_trips():
    for text in ["0F3", "12B0", "1RECV_F2", "3SEND_B17"]:
        assert str(Action.parse(text)) == text
    with pytest.raises(ValueError):
        Action.parse("F3")


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_schedule_text_parses_back(name):
    schedule = build_schedule(name, [1, 2, 1], 6)
    assert [list(o) for o in schedule.orders] == parse_orders(schedule.text())


def test_one_f_one_b_order_on_three_stages():
    schedule = build_schedule("1f1b-flush", [1, 1, 1], 4)
    assert " ".join(map(str, schedule.compute_order(0))) == "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3"
    assert " ".join(map(str, schedule.compute_order(2))) == "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3"
    gpipe = build_schedule("gpipe", [1, 1], 2)
    assert [str(a) for a in gpipe.compute_order(1)] == ["1F0", "1F1", "1B0", "1B1"]


@pytest.mark.parametrize("seed", range(30))
def test_random_topologies_validate_and_never_deadlock(seed):
    rng = random.Random(seed)
    replicas = [rng.randint(1, 3) for _ in range(rng.randint(1, 5))]
    n = rng.randint(1, 12)
    for name in SCHEDULE_NAMES:
        schedule = build_schedule(name, replicas, n)
        assert validate(schedule) == []
        stages = len(replicas)
        result = simulate(schedule, [rng.uniform(0.5, 2)] * stages, [rng.uniform(1, 3)] * stages)
        assert 0.0 <= result.bubble_fraction < 1.0


def test_bubble_matches_closed_form():
    # Equal stages, backward = 2 x forward: bubble = (p - 1) / (m + p - 1) for GPipe and 1F1B.
    for p in (4, 8, 16):
        for name in ("gpipe", "1f1b-flush"):
            assert predicted_bubble(name, p, 16) == pytest.approx((p - 1) / (16 + p - 1))


def test_validator_reports_missing_receive_and_backward_before_forward():
    good = build_schedule("1f1b-flush", [1, 1], 2)
    orders = [list(o) for o in good.orders]
    orders[1] = [a for a in orders[1] if str(a) != "1RECV_F1"]
    errors = validate(Schedule("bad", good.topology, 2, tuple(map(tuple, orders)), "flush"))
    assert any("lacks 1RECV_F1" in e for e in errors)
    orders = [list(o) for o in good.orders]
    orders[0] = [Action(0, "B", 0)] + orders[0]
    errors = validate(Schedule("bad", good.topology, 2, tuple(map(tuple, orders)), "flush"))
    assert any("before its forward" in e for e in errors)


def test_validator_reports_a_send_past_the_last_stage_and_a_stage_outside_the_topology():
    good = build_schedule("1f1b-flush", [1, 1], 2)
    orders = [list(o) for o in good.orders]
    orders[1].append(Action(1, "SEND_F", 0))  # the last stage has no next stage
    orders[0].append(Action(5, "RECV_F", 1))  # a stage the topology does not have
    errors = validate(Schedule("bad", good.topology, 2, tuple(map(tuple, orders)), "flush"))
    assert "rank1 step 8: 1SEND_F0 has no peer: there is no stage 2" in errors
    assert "rank0 step 8: 5RECV_F1 belongs to stage 5, not 0" in errors


def test_simulator_finds_deadlock_and_marks_grid():
    good = build_schedule("gpipe", [1, 1], 2)
    orders = [list(o) for o in good.orders]
    # Rank 0 waits for the gradient of microbatch 0 before sending microbatch 0 forward.
    recv = Action(0, "RECV_B", 0)
    orders[0].remove(recv)
    orders[0].insert(0, recv)
    with pytest.raises(ScheduleError) as info:
        simulate(Schedule("deadlocked", good.topology, 2, tuple(map(tuple, orders)), "flush"))
    assert "<-- ERROR HERE" in str(info.value)
    assert "waits 0RECV_B0" in str(info.value)


def test_vertical_sync_versions_come_from_stage_zero():
    schedule = build_schedule("1f1b-stash", [1, 1, 1], 6, vertical_sync=True)
    # Stage 0 runs F0 F1 F2 before its first backward, then alternates B, F.
    assert schedule.stash_versions() == {0: 0, 1: 0, 2: 0, 3: 1, 4: 2, 5: 3}
    with pytest.raises(ValueError):
        build_schedule("gpipe", [1, 1], 2, vertical_sync=True)
