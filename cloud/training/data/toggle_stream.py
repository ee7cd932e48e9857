"""Toggle-rate selection in a pipeline job (the ``[toggle]`` job section): each epoch's rows come
from a ``ToggleSampler`` that reads a ``ToggleTracker`` of every row's right/wrong answers.

Every rank holds the same selection (the sampler runs with one shard: the pipeline splits each
minibatch itself), the last stage's ranks record the answers of their microbatches' rows, and at
each epoch's end ``end_epoch`` merges the records on every rank (a collective of the whole job),
so the next epoch's selection is the same everywhere. The first ``warmup_epochs`` epochs train
on every row; after that an epoch is ``fraction`` of the rows (whole minibatches; the rest of a
partial one is dropped).

Invariant: the rows of every step are the same on every rank; ``state_dict`` taken at an epoch's
end, restored, gives the rows an uninterrupted job would train on from there.
"""

from __future__ import annotations

import torch

from cloud.training.data.sampler import ToggleSampler, settled_items
from cloud.training.data.stream import MinibatchStream
from cloud.training.data.toggle import ToggleState, ToggleTracker
from cloud.training.jobfile import JobError
from cloud.training.options import ToggleOptions


class ToggleStream(MinibatchStream):
    def __init__(self, base: MinibatchStream, options: ToggleOptions):
        super().__init__(base.train_x, base.train_y, base.test_x, base.test_y, base.seed, base.batch_size)
        n = len(self.train_y)
        self.options = options
        self.sampler = ToggleSampler(
            n,
            fraction=options.fraction,
            floor=options.floor,
            seed=self.seed,
            warmup_epochs=options.warmup_epochs,
        )
        self.tracker = ToggleTracker(n)
        budget = self.sampler.budget or n
        if budget < self.batch_size:
            raise JobError(
                f"toggle.fraction: {options.fraction} of {n} rows is {budget} rows, fewer than one "
                f"minibatch (train.batch_size {self.batch_size})"
            )
        self.selected_steps = budget // self.batch_size
        self.epoch = 0  # the epoch whose selection the sampler holds

    def epoch_steps(self, epoch: int) -> int:
        return self.steps_per_epoch if epoch < self.options.warmup_epochs else self.selected_steps

    def order(self, epoch: int) -> torch.Tensor:
        if epoch != self.epoch:
            raise RuntimeError(f"epoch {epoch}'s rows asked for while the sampler holds epoch {self.epoch}")
        return self.sampler.selection()

    def record(self, rows: torch.Tensor, correct: torch.Tensor) -> None:
        """One microbatch's answers (last stage): ``correct[i]`` for training-set row ``rows[i]``."""
        self.tracker.record(rows, correct)

    def end_epoch(self) -> ToggleState:
        """Every rank, at the end of ``self.epoch``: merge the answers, select the next epoch."""
        state = self.tracker.merge()
        self.epoch += 1
        self.sampler.set_epoch(self.epoch, state)
        return state

    def report(self) -> dict:
        """Live figures for a progress line (the same on every rank)."""
        state = self.tracker.state()
        seen = state.presentations > 0
        return {
            "epoch": self.epoch,
            "selected": len(self.sampler.selection()),
            "rows": len(self.train_y),
            "settled": int(settled_items(state).sum()),
            "fraction": self.options.fraction,
            "mean_toggle_rate": round(float(state.toggle_rate()[seen].mean()), 4)
            if bool(seen.any())
            else 0.0,
        }

    def state_dict(self) -> dict:
        """At an epoch's end (after ``end_epoch``): what a resumed job needs to select as this one."""
        state = self.tracker.state()
        return {
            "epoch": self.epoch,
            **{name: getattr(state, name) for name in ToggleState.__dataclass_fields__},
        }

    def load_state_dict(self, saved: dict) -> None:
        for name in ToggleState.__dataclass_fields__:
            setattr(self.tracker, name, saved[name].clone())
        self.epoch = saved["epoch"]
        self.sampler.set_epoch(self.epoch, self.tracker.state())
