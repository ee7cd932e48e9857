"""Per-item toggle tracking: how often an item's prediction flips between right and wrong.

Each presentation of an item during training records one bit (was the prediction right). A
toggle is a change of that bit between consecutive presentations, in either direction (Toneva et
al. count only right -> wrong "forgetting events"; the toggle rate is the superset; both are kept,
as an item learned once and never forgotten has toggled once, on being learned). During an
epoch each rank records only the items of its shard; ``merge`` all-gathers the ranks' records at
epoch end so every rank holds the same merged state, which the sampler then reads.

Invariant: after ``merge`` the state (every field of ``ToggleState``) is identical on every rank,
and equals what one process would have recorded seeing all shards' presentations in rank order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

UNSEEN = -1


@dataclass(frozen=True)
class ToggleState:
    presentations: torch.Tensor  # (N,) int64: times each item was trained on
    toggles: torch.Tensor  # (N,) int64: right<->wrong changes between consecutive presentations
    last: torch.Tensor  # (N,) int8: 1 right, 0 wrong, -1 never seen
    forgets: torch.Tensor  # (N,) int64: the right -> wrong toggles among them
    streak: torch.Tensor  # (N,) int64: right answers in a row, up to the last presentation

    def toggle_rate(self) -> torch.Tensor:
        """Toggles per chance to toggle (presentations - 1); 0 where there was no chance yet."""
        chances = (self.presentations - 1).clamp(min=1)
        return self.toggles.double() / chances.double()


class ToggleTracker:
    def __init__(self, n_items: int) -> None:
        self.n_items = n_items
        self.presentations = torch.zeros(n_items, dtype=torch.int64)
        self.toggles = torch.zeros(n_items, dtype=torch.int64)
        self.last = torch.full((n_items,), UNSEEN, dtype=torch.int8)
        self.forgets = torch.zeros(n_items, dtype=torch.int64)
        self.streak = torch.zeros(n_items, dtype=torch.int64)
        self._epoch_forgets = torch.zeros(n_items, dtype=torch.int64)
        self._epoch_streak = torch.zeros(n_items, dtype=torch.int64)  # rights in a row at the epoch's end
        self._epoch_wrong = torch.zeros(n_items, dtype=torch.int64)  # 1: some answer this epoch was wrong
        self._epoch_presentations = torch.zeros(n_items, dtype=torch.int64)
        self._epoch_toggles = torch.zeros(n_items, dtype=torch.int64)
        self._epoch_last = torch.full((n_items,), UNSEEN, dtype=torch.int8)
        self._epoch_first = torch.full((n_items,), UNSEEN, dtype=torch.int8)

    def record(self, indices: torch.Tensor, correct: torch.Tensor) -> None:
        """One presentation per index (indices unique within a call), ``correct`` as bools."""
        bits = correct.to(torch.int8)
        previous = self._epoch_last[indices]  # toggles against earlier epochs are counted in merge()
        self._epoch_toggles[indices] += ((previous != UNSEEN) & (previous != bits)).long()
        self._epoch_forgets[indices] += ((previous == 1) & (bits == 0)).long()
        self._epoch_streak[indices] = torch.where(bits == 1, self._epoch_streak[indices] + 1, 0)
        self._epoch_wrong[indices] |= (bits == 0).long()
        first = self._epoch_first[indices]
        self._epoch_first[indices] = torch.where(first == UNSEEN, bits, first)
        self._epoch_last[indices] = bits
        self._epoch_presentations[indices] += 1

    def merge(self, group: dist.ProcessGroup | None = None) -> ToggleState:
        """Fold this epoch's records of every rank into the state (all ranks end identical)."""
        local = torch.stack(
            [
                self._epoch_presentations,
                self._epoch_toggles,
                self._epoch_last.long(),
                self._epoch_first.long(),
                self._epoch_forgets,
                self._epoch_streak,
                self._epoch_wrong,
            ]
        )
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
            gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size(group))]
            dist.all_gather(gathered, local, group=group)
        else:
            gathered = [local]
        for part in gathered:  # rank order, so every rank folds the same way
            seen = part[0] > 0
            first, last = part[3].to(torch.int8), part[2].to(torch.int8)
            crossing = seen & (self.last != UNSEEN) & (self.last != first)  # vs the state folded so far
            self.toggles += part[1] + crossing.long()
            self.forgets += part[4] + (crossing & (first == 0)).long()
            streak = torch.where(part[6] > 0, part[5], self.streak + part[5])  # a wrong answer restarts it
            self.streak = torch.where(seen, streak, self.streak)
            self.presentations += part[0]
            self.last = torch.where(seen, last, self.last)
        self._epoch_presentations.zero_()
        self._epoch_toggles.zero_()
        self._epoch_forgets.zero_()
        self._epoch_streak.zero_()
        self._epoch_wrong.zero_()
        self._epoch_last.fill_(UNSEEN)
        self._epoch_first.fill_(UNSEEN)
        return self.state()

    def state(self) -> ToggleState:
        return ToggleState(
            self.presentations.clone(),
            self.toggles.clone(),
            self.last.clone(),
            self.forgets.clone(),
            self.streak.clone(),
        )
