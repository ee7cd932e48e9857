"""Choosing the next epoch's items from the toggle record, the same choice on every rank.

An item is *settled* when it was never forgotten (no right -> wrong toggle: its only toggle, if
any, was being learned) and its last ``settle_after`` (at least 2) predictions were right.
Two selections, both pure and seeded by (seed, epoch) so every rank computes the same list:

- ``select_unsettled`` (``fraction=None``, the patent's rule): every unsettled item, plus a
  ``floor`` share of the settled ones drawn at random (the exploration floor: a settled item that
  turns out forgotten when re-checked is unsettled from then on). The epoch's size follows the
  state: it shrinks as items settle.
- ``select_items`` (a fixed ``fraction``): ``budget`` items drawn without replacement, item i with
  weight ``floor + (1 - floor) * score_i``. The score says how recently the item toggled to wrong:
  1 for items wrong on their last presentation (or never seen), halved for each right answer in a
  row since (``RIGHT_ANSWER_DISCOUNT``), so an item right on its only presentation, or just
  relearned, scores 0.5, and 0 once settled. A forgotten item never settles: its score halves
  towards 0 while it stays right, and the next wrong answer puts it back at 1.

``ToggleSampler`` hands rank r every world-th item of the list. For the first ``warmup_epochs``
epochs it takes every item in a seeded random order (the record needs presentations first).

Invariant: the list depends only on (state, fraction, floor, seed, epoch); each rank's shard has
the same length (the list is cut to a multiple of the world size), so ranks take equal steps.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from cloud.training.data.toggle import UNSEEN, ToggleState

# Each right answer in a row halves an unsettled item's score: an item that was wrong a pass ago
# needs more work than one that has been right for several (measured: docs/training-sync.md).
RIGHT_ANSWER_DISCOUNT = 0.5


def settled_items(state: ToggleState, settle_after: int = 2) -> torch.Tensor:
    return (state.streak >= max(2, settle_after)) & (state.forgets == 0)


def item_scores(state: ToggleState, settle_after: int = 2) -> torch.Tensor:
    since_wrong = RIGHT_ANSWER_DISCOUNT ** state.streak.double()  # streak is 0 unless last is right
    score = torch.where(state.last == 1, since_wrong, torch.ones_like(since_wrong))
    return torch.where(settled_items(state, settle_after), torch.zeros_like(score), score)


def _generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def select_items(
    state: ToggleState, budget: int, floor: float, seed: int, epoch: int, settle_after: int = 2
) -> torch.Tensor:
    n = state.presentations.numel()
    if not 0 < budget <= n:
        raise ValueError(f"budget {budget} must be in 1..{n}")
    if not 0 < floor <= 1:
        raise ValueError(f"floor {floor} must be in (0, 1]")
    weights = floor + (1 - floor) * item_scores(state, settle_after)
    return torch.multinomial(weights, budget, replacement=False, generator=_generator(seed, epoch))


def select_unsettled(
    state: ToggleState, floor: float, seed: int, epoch: int, settle_after: int = 2
) -> torch.Tensor:
    if not 0 < floor <= 1:
        raise ValueError(f"floor {floor} must be in (0, 1]")
    generator = _generator(seed, epoch)
    settled = settled_items(state, settle_after)
    explored = settled & (torch.rand(settled.shape, generator=generator) < floor)
    chosen = (~settled | explored).nonzero().view(-1)
    return chosen[torch.randperm(len(chosen), generator=generator)]


class ToggleSampler(Sampler[int]):
    """This rank's share of the epoch's selection; call ``set_epoch(epoch, state)`` each epoch."""

    def __init__(
        self,
        n_items: int,
        *,
        fraction: float | None,
        floor: float = 0.1,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        warmup_epochs: int = 0,
        settle_after: int = 2,
    ) -> None:
        self.n_items = n_items
        self.warmup_epochs = warmup_epochs  # epochs over every item before selection starts
        self.budget = None if fraction is None else max(world_size, int(round(fraction * n_items)))
        self.floor = floor
        self.settle_after = settle_after  # right answers in a row (never forgotten) that settle an item
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self._state = ToggleState(
            torch.zeros(n_items, dtype=torch.int64),
            torch.zeros(n_items, dtype=torch.int64),
            torch.full((n_items,), UNSEEN, dtype=torch.int8),
            torch.zeros(n_items, dtype=torch.int64),
            torch.zeros(n_items, dtype=torch.int64),
        )
        self._selection: torch.Tensor | None = None  # cached for the current (epoch, state)

    def set_epoch(self, epoch: int, state: ToggleState | None = None) -> None:
        self.epoch = epoch
        if state is not None:
            self._state = state
        self._selection = None

    def selection(self) -> torch.Tensor:
        if self._selection is None:
            if self.epoch < self.warmup_epochs:
                chosen = torch.randperm(self.n_items, generator=_generator(self.seed, self.epoch))
            elif self.budget is None:
                chosen = select_unsettled(self._state, self.floor, self.seed, self.epoch, self.settle_after)
            else:
                chosen = select_items(
                    self._state, self.budget, self.floor, self.seed, self.epoch, self.settle_after
                )
            if len(chosen) < self.world_size:  # everything settled and none drawn: re-check them all
                chosen = torch.randperm(self.n_items, generator=_generator(self.seed, self.epoch))
            self._selection = chosen[: len(chosen) - len(chosen) % self.world_size]
        return self._selection

    def __iter__(self) -> Iterator[int]:
        return iter(self.selection()[self.rank :: self.world_size].tolist())

    def __len__(self) -> int:
        return len(self.selection()) // self.world_size
