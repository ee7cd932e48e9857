"""Toggle tracking and toggle-rate selection, pure (world size 1 for the tracker merge)."""

from __future__ import annotations

import torch

from cloud.training.data.sampler import (
    ToggleSampler,
    item_scores,
    select_items,
    select_unsettled,
    settled_items,
)
from cloud.training.data.toggle import ToggleTracker


def test_toggles_count_both_directions_across_epochs() -> None:
    tracker = ToggleTracker(3)
    for bits in ([1, 1, 0], [0, 1, 0], [1, 1, 0]):
        tracker.record(torch.arange(3), torch.tensor(bits, dtype=torch.bool))
        state = tracker.merge()
    assert state.toggles.tolist() == [2, 0, 0]
    assert state.presentations.tolist() == [3, 3, 3]
    assert state.last.tolist() == [1, 1, 0]
    assert state.toggle_rate().tolist() == [1.0, 0.0, 0.0]  # toggles per chance to toggle


def test_scores_follow_how_recently_an_item_was_wrong() -> None:
    tracker = ToggleTracker(4)
    for bits in ([1, 1, 0], [0, 1, 0], [1, 1, 0]):
        tracker.record(torch.arange(3), torch.tensor(bits, dtype=torch.bool))
        state = tracker.merge()
    assert item_scores(state).tolist() == [0.5, 0.0, 1.0, 1.0]  # relearned, settled, wrong, unseen
    for _ in range(3):  # a forgotten item never settles: it halves per right answer in a row...
        tracker.record(torch.tensor([0]), torch.tensor([True]))
        state = tracker.merge()
    assert item_scores(state)[0] == 0.0625
    tracker.record(torch.tensor([0]), torch.tensor([False]))  # ...and is back at 1 when wrong again
    assert item_scores(tracker.merge())[0] == 1.0


def test_selection_is_deterministic_and_explores() -> None:
    tracker = ToggleTracker(1000)
    tracker.record(torch.arange(1000), torch.ones(1000, dtype=torch.bool))
    tracker.merge()
    flips = torch.arange(1000) < 100
    tracker.record(torch.arange(1000), ~flips)  # items 0..99 flip, the rest stay right (known stable)
    state = tracker.merge()
    first = select_items(state, 200, floor=0.1, seed=3, epoch=5)
    assert torch.equal(first, select_items(state, 200, floor=0.1, seed=3, epoch=5))
    togglers = int((first < 100).sum())
    assert togglers > 60  # 100 of weight 1 vs 900 of weight 0.1: most picks are togglers...
    assert togglers < 200  # ...but stable items are still explored


def test_sampler_shards_the_same_selection() -> None:
    shards = [ToggleSampler(101, fraction=0.5, seed=1, rank=r, world_size=2) for r in range(2)]
    lists = [list(s) for s in shards]
    assert len(lists[0]) == len(lists[1]) == len(shards[0])
    assert not set(lists[0]) & set(lists[1])
    assert sorted(lists[0] + lists[1]) == sorted(shards[0].selection().tolist())


def test_once_seen_items_are_not_yet_settled_and_warmup_takes_everything() -> None:
    tracker = ToggleTracker(3)
    tracker.record(torch.arange(2), torch.tensor([True, False]))
    state = tracker.merge()
    assert not settled_items(state).any()
    assert item_scores(state).tolist() == [0.5, 1.0, 1.0]  # right once, wrong, unseen
    sampler = ToggleSampler(10, fraction=0.3, seed=2, warmup_epochs=1)
    assert sorted(sampler) == list(range(10)) and len(sampler) == 10
    sampler.set_epoch(1)
    assert len(list(sampler)) == len(sampler) == 3


def test_learned_and_never_forgotten_items_settle_after_a_streak() -> None:
    tracker = ToggleTracker(5)
    # columns: learned, forgotten and relearned, forgotten, learned late, always right
    epochs = ([0, 1, 1, 0, 1], [1, 0, 1, 0, 1], [1, 1, 0, 1, 1])
    for bits in epochs:
        tracker.record(torch.arange(5), torch.tensor(bits, dtype=torch.bool))
        state = tracker.merge()
    assert state.forgets.tolist() == [0, 1, 1, 0, 0]
    assert state.streak.tolist() == [2, 1, 0, 1, 3]
    assert settled_items(state).tolist() == [True, False, False, False, True]
    assert settled_items(state, settle_after=3).tolist() == [False, False, False, False, True]
    tracker.record(torch.tensor([3]), torch.tensor([True]))  # two presentations in one epoch
    tracker.record(torch.tensor([3]), torch.tensor([True]))
    assert tracker.merge().streak[3] == 3


def test_unsettled_selection_keeps_every_unsettled_item_and_explores_settled_ones() -> None:
    tracker = ToggleTracker(1000)
    unsettled = torch.arange(1000) < 50  # wrong on the second pass
    for bits in (torch.ones(1000, dtype=torch.bool), ~unsettled):
        tracker.record(torch.arange(1000), bits)
        state = tracker.merge()
    chosen = select_unsettled(state, floor=0.1, seed=1, epoch=4)
    assert torch.equal(chosen, select_unsettled(state, floor=0.1, seed=1, epoch=4))
    assert set(range(50)) <= set(chosen.tolist())
    explored = int((chosen >= 50).sum())
    assert 50 < explored < 150  # about a tenth of the 950 settled items
    sampler = ToggleSampler(1000, fraction=None, floor=0.1, seed=1, warmup_epochs=1)
    sampler.set_epoch(4, state)
    assert len(list(sampler)) == len(sampler) == len(chosen)
