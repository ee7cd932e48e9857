"""The job's data: its training minibatches in a seeded order, held-out rows, and its loss.

Invariant: the rows of a step depend only on (seed, step) and, for a subclass that selects rows
per epoch, on what it was told at the end of each earlier epoch; a resumed job that restores that
reads exactly the minibatches an uninterrupted one would.
"""

from __future__ import annotations

import pickle

import torch
from torch import nn

from cloud.training.jobfile import DataSection, JobError


class MinibatchStream:
    """Minibatches of a training set in the order of ``models.digits.train_single_process`` (one
    randperm per epoch from one generator seeded with the job seed); a trailing partial minibatch is
    dropped. ``test_x``/``test_y`` are the held-out rows (possibly none). A subclass may choose other
    rows per epoch (``ToggleStream``): ``epoch_steps`` and ``order`` say which."""

    def __init__(
        self,
        train_x: torch.Tensor,
        train_y: torch.Tensor,
        test_x: torch.Tensor,
        test_y: torch.Tensor,
        seed: int,
        batch_size: int,
    ):
        if len(train_x) < batch_size:
            raise JobError(f"train.batch_size: {batch_size} > the {len(train_x)} training rows of the data")
        self.train_x, self.train_y, self.test_x, self.test_y = train_x, train_y, test_x, test_y
        self.seed, self.batch_size = seed, batch_size
        self.steps_per_epoch = len(train_y) // batch_size  # of an epoch over every row
        self._order: tuple[int, torch.Tensor] | None = None  # (epoch, its row order), the last one used

    def epoch_steps(self, epoch: int) -> int:
        return self.steps_per_epoch

    def locate(self, step: int) -> tuple[int, int]:
        """(epoch, minibatch within it) of the 0-based ``step``."""
        epoch = 0
        while step >= self.epoch_steps(epoch):
            step -= self.epoch_steps(epoch)
            epoch += 1
        return epoch, step

    def total_steps(self, epochs: int) -> int:
        return sum(self.epoch_steps(e) for e in range(epochs))

    def order(self, epoch: int) -> torch.Tensor:
        """The epoch's rows in the order they are trained on."""
        if self._order is None or self._order[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed)
            for _ in range(epoch + 1):
                order = torch.randperm(len(self.train_y), generator=generator)
            self._order = (epoch, order)
        return self._order[1]

    def rows(self, step: int) -> torch.Tensor:
        """The training-set rows of the 0-based ``step``'s minibatch."""
        epoch, index = self.locate(step)
        return self.order(epoch)[index * self.batch_size : (index + 1) * self.batch_size]

    def minibatch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.rows(step)
        return self.train_x[rows], self.train_y[rows]


class DigitsStream(MinibatchStream):
    def __init__(self, seed: int, batch_size: int):
        from models.digits import load_digits_split

        split = load_digits_split(seed)
        super().__init__(split.train_x, split.train_y, split.test_x, split.test_y, seed, batch_size)


def load_stream(data: DataSection, seed: int, batch_size: int) -> MinibatchStream:
    return (
        DigitsStream(seed, batch_size)
        if data.dataset == "digits"
        else tensor_file_stream(data, seed, batch_size)
    )


def tensor_file_stream(data: DataSection, seed: int, batch_size: int) -> MinibatchStream:
    """The job's tensor file, checked against its loss, split by a generator seeded with ``seed``."""
    try:
        tensors = torch.load(data.path, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise JobError(f"data.path: cannot load {data.path}: {exc}") from exc
    x = tensors.get("x") if isinstance(tensors, dict) else None
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2 or not len(x):
        raise JobError(f"data.path: {data.path} must hold {{'x': float tensor (N, ...), 'y': ...}}")
    if data.loss == "reconstruction":
        y = x
    else:
        y = tensors.get("y")
        if not isinstance(y, torch.Tensor) or len(y) != len(x):
            raise JobError(f"data.path: loss {data.loss} needs 'y' with one row per row of x ({len(x)})")
        if data.loss == "cross_entropy" and (y.is_floating_point() or y.dim() != 1):
            raise JobError("data.loss: cross_entropy needs y as integer class indices of shape (N,)")
        if data.loss == "mse" and not y.is_floating_point():
            raise JobError("data.loss: mse needs y as float targets")
        y = y.long() if data.loss == "cross_entropy" else y
    test, train = split_rows(len(x), data.test_fraction, seed)
    return MinibatchStream(x[train], y[train], x[test], y[test], seed, batch_size)


def split_rows(rows: int, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(held-out row indices, training row indices) of a tensor file: the quality gate
    (cloud/rollout/gate.py) evaluates on exactly the rows a job held out."""
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    n_test = int(rows * test_fraction)
    return order[:n_test], order[n_test:]


def loss_function(data: DataSection) -> nn.Module:
    return nn.CrossEntropyLoss() if data.loss == "cross_entropy" else nn.MSELoss()


def check_loss_fits(
    model: nn.Sequential, loss_fn: nn.Module, data: DataSection, x: torch.Tensor, y: torch.Tensor
) -> None:
    """One forward of the whole model on a few rows (eval mode, no grad: no state changes), so that a
    model that does not take x, or whose output does not fit y, fails as a bad job naming the shapes."""
    model.eval()
    try:
        with torch.no_grad():
            output = model(x)
    except RuntimeError as exc:
        raise JobError(f"model.name: the model does not take x of shape {tuple(x.shape)}: {exc}") from exc
    finally:
        model.train()
    problem = ""
    if data.loss != "cross_entropy" and output.shape != y.shape:
        problem = "shapes differ"  # MSELoss would broadcast them and train on nonsense
    else:
        try:
            loss_fn(output, y)
        except (RuntimeError, IndexError) as exc:
            problem = str(exc)
    if problem:
        raise JobError(
            f"data.loss: {data.loss} of the model's output {tuple(output.shape)} against y "
            f"{tuple(y.shape)}: {problem}"
        )
