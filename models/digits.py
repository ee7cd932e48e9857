"""The digits task: scikit-learn's bundled 8x8 handwritten digits, a small CNN, and the
single-process training loop that distributed trainers are checked against.

Invariant: ``load_digits_split(seed)`` is deterministic: the same seed gives the same train and
test tensors on every rank and every run, so results of different trainers can be compared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from protocol.federated import ModelKind

N_CLASSES = 10


@dataclass(frozen=True)
class DigitsSplit:
    train_x: torch.Tensor  # (N, 1, 8, 8) float32, scaled to [0, 1]
    train_y: torch.Tensor  # (N,) int64
    test_x: torch.Tensor
    test_y: torch.Tensor


def load_digits_split(seed: int = 0, test_fraction: float = 0.2) -> DigitsSplit:
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.from_numpy((data.images / 16.0).astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(data.target.astype(np.int64))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return DigitsSplit(x[train], y[train], x[test], y[test])


def digits_cnn(width: int = 16) -> nn.Sequential:
    """A small CNN as a flat ``nn.Sequential`` so that a pipeline can cut it between any layers."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * width * 4 * 4, 64),
        nn.ReLU(),
        nn.Linear(64, N_CLASSES),
    )


def digits_mlp(width: int = 64) -> nn.Sequential:
    """A one-hidden-layer MLP over the 64 pixels: cheap enough to train on a gateway."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, N_CLASSES))


DIGITS_MODELS: dict[ModelKind, Callable[[int], nn.Sequential]] = {
    "digits_cnn": digits_cnn,
    "digits_mlp": digits_mlp,
}


def build_digits_model(kind: ModelKind, width: int) -> nn.Sequential:
    """The digits architecture named ``kind``: the one builder the gateway and the cloud share."""
    try:
        return DIGITS_MODELS[kind](width)
    except KeyError:
        raise ValueError(f"unknown digits model {kind!r}; known: {sorted(DIGITS_MODELS)}") from None


def non_iid_split(y: torch.Tensor, n: int, major: float = 0.8, seed: int = 0) -> list[torch.Tensor]:
    """Indices of ``y`` for ``n`` clients, not identically distributed: client g holds ``major`` of
    classes g and g+1 (mod n); the rest of each class is spread evenly. Federated tests use it."""
    generator = torch.Generator().manual_seed(seed)
    parts: list[list[int]] = [[] for _ in range(n)]
    for c in range(N_CLASSES):
        members = (y == c).nonzero().view(-1)
        items = members[torch.randperm(len(members), generator=generator)].tolist()
        k = int(len(items) * major)
        for i, item in enumerate(items[:k]):
            parts[(c - i % 2) % n].append(item)
        for i, item in enumerate(items[k:]):
            parts[i % n].append(item)
    return [torch.tensor(p) for p in parts]


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        predicted = model(x).argmax(dim=1)
    model.train()
    return float((predicted == y).float().mean())


def train_single_process(
    model: nn.Module,
    split: DigitsSplit,
    *,
    epochs: int = 10,
    batch_size: int = 32,
    lr: float = 0.05,
    seed: int = 0,
) -> list[float]:
    """Plain SGD with momentum; returns the mean training loss per epoch. The reference trainer."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(split.train_y), generator=generator)
        total, batches = 0.0, 0
        for start in range(0, len(order), batch_size):
            index = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(split.train_x[index]), split.train_y[index])
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        losses.append(total / batches)
    return losses


def main() -> None:
    torch.manual_seed(0)
    split = load_digits_split()
    model = digits_cnn()
    losses = train_single_process(model, split)
    print(f"final loss {losses[-1]:.4f}  test accuracy {accuracy(model, split.test_x, split.test_y):.4f}")


if __name__ == "__main__":
    main()
