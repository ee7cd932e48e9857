"""The camera scene task: a small CNN that names the dominant object class of a frame (or "empty"),
its dataset drawn from the camera simulator's own renderer, and the single-process trainer.

``python -m models.scene --out models/artifacts/scene`` trains (~1 minute on 2 cores) and writes
the ONNX artifact the gateway runs.

Invariant: `scene_dataset(seed, n)` is deterministic, and its inputs go through the same
`preprocess_images` the gateway applies to camera frames.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from models.artifact import preprocess_images, save_artifact
from models.synthetic_scene import LABELS, background, random_training_frame
from protocol.events import InputSpec

INPUT_SIZE = 48


def scene_input_spec(input_size: int = INPUT_SIZE) -> dict[str, Any]:
    """The artifact's input: ``input_size`` square RGB frames in [0, 1], any batch."""
    return {
        "name": "input",
        "shape": [None, 3, input_size, input_size],
        "dtype": "float32",
        "preprocess": "image_rgb01",
    }


INPUT_SPEC = scene_input_spec()


@dataclass(frozen=True)
class SceneData:
    x: torch.Tensor  # (N, 3, S, S) float32 in [0, 1]
    y: torch.Tensor  # (N,) int64 index into LABELS


def scene_dataset(seed: int, n: int, width: int = 320, height: int = 240) -> SceneData:
    rng = np.random.default_rng(seed)
    base = background(width, height)
    frames, labels = [], []
    for _ in range(n):
        frame, label = random_training_frame(rng, width, height, base)
        frames.append(frame)
        labels.append(LABELS.index(label))
    x = preprocess_images(frames, InputSpec.model_validate(INPUT_SPEC))
    return SceneData(torch.from_numpy(x), torch.tensor(labels, dtype=torch.int64))


def scene_cnn(width: int = 8, input_size: int = INPUT_SIZE) -> nn.Sequential:
    """Flat ``nn.Sequential`` so the pipeline trainer can cut it between any two layers. The
    defaults are the shipped model; a larger ``input_size`` or ``width`` only costs more per frame."""
    pooled = input_size // 8  # three 2x2 max pools, each rounding down
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 24 at the default input size
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 12
        nn.Conv2d(2 * width, 4 * width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 6
        nn.Flatten(),
        nn.Linear(4 * width * pooled * pooled, 32),
        nn.ReLU(),
        nn.Linear(32, len(LABELS)),
    )


def accuracy(model: nn.Module, data: SceneData) -> float:
    model.eval()
    with torch.no_grad():
        predicted = model(data.x).argmax(dim=1)
    model.train()
    return float((predicted == data.y).float().mean())


def train_single_process(
    model: nn.Module,
    data: SceneData,
    *,
    epochs: int = 8,
    batch_size: int = 32,
    lr: float = 2e-3,
    seed: int = 0,
) -> list[float]:
    """Adam over shuffled minibatches; returns mean training loss per epoch. The reference trainer."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(data.y), generator=generator)
        total, batches = 0.0, 0
        for start in range(0, len(order), batch_size):
            index = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(data.x[index]), data.y[index])
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        losses.append(total / batches)
    return losses


def main(argv: list[str] | None = None) -> int:
    from models.export import export_artifact

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/artifacts/scene"))
    parser.add_argument("--version", default="1")
    parser.add_argument("--train", type=int, default=3000)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    train, test = scene_dataset(args.seed, args.train), scene_dataset(args.seed + 1000, 500)
    model = scene_cnn()
    losses = train_single_process(model, train, epochs=args.epochs, seed=args.seed)
    test_accuracy = accuracy(model, test)
    print(f"final loss {losses[-1]:.4f}  test accuracy {test_accuracy:.4f}")
    artifact = export_artifact(
        model,
        train.x[:1],
        name="scene",
        version=args.version,
        input_spec=INPUT_SPEC,
        postprocess="softmax_labels",
        labels=list(LABELS),
        notes={
            "test_accuracy": test_accuracy,
            "train_items": args.train,
            "epochs": args.epochs,
            "seed": args.seed,
        },
    )
    save_artifact(args.out, artifact)
    print(f"wrote {args.out} ({artifact.metadata.size} bytes, sha256 {artifact.metadata.sha256[:16]}...)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
