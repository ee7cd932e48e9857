"""Choosing the next epoch's items by toggle rate, the same choice on every rank.

``select_items`` is pure: from the merged ``ToggleState`` it draws ``budget`` items without
replacement, item i with weight ``floor + (1 - floor) * score_i``, where the score is the toggle
rate, raised to 1 for items whose stability is not known yet (fewer than two presentations: no
chance to toggle) and for items whose last prediction was wrong (an item never learned is the most
forgettable, as in Toneva et al.). The floor is the exploration term: stable items keep a chance to
be re-checked. The draw is seeded by (seed, epoch), so every rank computes the same list;
``ToggleSampler`` then hands rank r every world-th item of it. For the first ``warmup_epochs``
epochs the sampler takes every item in a seeded random order (the toggle record needs a few
presentations per item before it means anything).

Invariant: the list depends only on (state, budget, floor, seed, epoch); each rank's shard has
the same length (the list is cut to a multiple of the world size), so ranks take equal steps.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from cloud.training.data.toggle import UNSEEN, ToggleState


def item_scores(state: ToggleState) -> torch.Tensor:
    score = state.toggle_rate().clamp(max=1.0)
    unknown = state.presentations < 2  # no chance to toggle yet: not known to be stable
    needs_work = unknown | (state.last == UNSEEN) | (state.last == 0)
    return torch.where(needs_work, torch.ones_like(score), score)


def select_items(state: ToggleState, budget: int, floor: float, seed: int, epoch: int) -> torch.Tensor:
    n = state.presentations.numel()
    if not 0 < budget <= n:
        raise ValueError(f"budget {budget} must be in 1..{n}")
    if not 0 < floor <= 1:
        raise ValueError(f"floor {floor} must be in (0, 1]")
    weights = floor + (1 - floor) * item_scores(state)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.multinomial(weights, budget, replacement=False, generator=generator)


class ToggleSampler(Sampler[int]):
    """This rank's share of the epoch's selection; call ``set_epoch(epoch, state)`` each epoch."""

    def __init__(self, n_items: int, *, fraction: float, floor: float = 0.1, seed: int = 0,
                 rank: int = 0, world_size: int = 1, warmup_epochs: int = 0) -> None:
        self.n_items = n_items
        self.warmup_epochs = warmup_epochs  # epochs over every item before selection starts
        self.budget = max(world_size, int(round(fraction * n_items)))
        self.floor = floor
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self._state = ToggleState(torch.zeros(n_items, dtype=torch.int64),
                                  torch.zeros(n_items, dtype=torch.int64),
                                  torch.full((n_items,), UNSEEN, dtype=torch.int8))

    def set_epoch(self, epoch: int, state: ToggleState | None = None) -> None:
        self.epoch = epoch
        if state is not None:
            self._state = state

    def selection(self) -> torch.Tensor:
        if self.epoch < self.warmup_epochs:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            chosen = torch.randperm(self.n_items, generator=generator)
            return chosen[:len(chosen) - len(chosen) % self.world_size]
        chosen = select_items(self._state, self.budget, self.floor, self.seed, self.epoch)
        return chosen[:len(chosen) - len(chosen) % self.world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self.selection()[self.rank::self.world_size].tolist())

    def __len__(self) -> int:
        size = self.n_items if self.epoch < self.warmup_epochs else self.budget
        return (size - size % self.world_size) // self.world_size
