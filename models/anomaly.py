"""The sensor-window task: an MLP autoencoder over windows of (temperature, humidity, soil moisture)
readings; a window it reconstructs badly is an anomaly.

Windows are normalised with fixed per-channel scales (`normalise_window`, numpy only) so that the
gateway can build inputs without torch. The threshold is the 99.5th percentile of reconstruction
error on normal training windows and travels in the artifact's metadata.

``python -m models.anomaly --out models/artifacts/anomaly`` trains in a few seconds.

Invariant: `sensor_windows(seed, ...)` is deterministic; anomalous windows (spikes, stuck sensor,
drift) are labelled and never used for training.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

WINDOW = 16
CHANNELS = 3  # temperature_c, humidity_pct, soil_moisture_pct
CENTRE = np.array([20.0, 55.0, 35.0], dtype=np.float32)
SCALE = np.array([10.0, 20.0, 15.0], dtype=np.float32)
INPUT_SPEC = {"name": "input", "shape": [None, WINDOW * CHANNELS], "dtype": "float32", "preprocess": "none"}


def normalise_window(readings: np.ndarray) -> np.ndarray:
    """(WINDOW, CHANNELS) raw readings -> flat float32 vector the model takes."""
    return ((np.asarray(readings, np.float32) - CENTRE) / SCALE).reshape(-1)


@dataclass(frozen=True)
class WindowData:
    x: torch.Tensor  # (N, WINDOW*CHANNELS)
    anomalous: torch.Tensor  # (N,) bool


def _normal_window(rng: np.random.Generator) -> np.ndarray:
    t = np.arange(WINDOW, dtype=np.float32)
    phase, base = rng.uniform(0, 2 * np.pi), rng.uniform(-1, 1, CHANNELS)
    slow = np.sin(phase + t / 12.0)
    window = CENTRE + SCALE * 0.3 * base + np.outer(slow, SCALE * 0.15)
    return window + rng.normal(0, 0.02, (WINDOW, CHANNELS)) * SCALE


def _anomalous_window(rng: np.random.Generator) -> np.ndarray:
    window = _normal_window(rng)
    channel, at = int(rng.integers(CHANNELS)), int(rng.integers(WINDOW))
    kind = int(rng.integers(3))
    if kind == 0:  # spike
        window[at, channel] += SCALE[channel] * rng.choice([-1, 1]) * rng.uniform(1.0, 2.0)
    elif kind == 1:  # stuck at an implausible constant
        window[at:, channel] = CENTRE[channel] + SCALE[channel] * rng.choice([-1.5, 1.5])
    else:  # fast drift
        window[:, channel] += np.linspace(0, SCALE[channel] * rng.uniform(1.0, 1.6), WINDOW)
    return window


def sensor_windows(seed: int, n: int, anomaly_fraction: float = 0.0) -> WindowData:
    rng = np.random.default_rng(seed)
    flags = rng.random(n) < anomaly_fraction
    rows = [normalise_window(_anomalous_window(rng) if flag else _normal_window(rng)) for flag in flags]
    return WindowData(torch.from_numpy(np.stack(rows)), torch.from_numpy(flags))


def anomaly_autoencoder(hidden: int = 24, code: int = 6) -> nn.Sequential:
    size = WINDOW * CHANNELS
    return nn.Sequential(
        nn.Linear(size, hidden),
        nn.ReLU(),
        nn.Linear(hidden, code),
        nn.ReLU(),
        nn.Linear(code, hidden),
        nn.ReLU(),
        nn.Linear(hidden, size),
    )


def reconstruction_error(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return ((model(x) - x) ** 2).mean(dim=1)


def train_single_process(
    model: nn.Module,
    data: WindowData,
    *,
    epochs: int = 30,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Adam on reconstruction MSE over normal windows only; mean loss per epoch."""
    x = data.x[~data.anomalous]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        total, batches = 0.0, 0
        for start in range(0, len(order), batch_size):
            batch = x[order[start : start + batch_size]]
            optimizer.zero_grad()
            loss = ((model(batch) - batch) ** 2).mean()
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        losses.append(total / batches)
    return losses


def fit_threshold(model: nn.Module, data: WindowData, quantile: float = 0.995) -> float:
    errors = reconstruction_error(model, data.x[~data.anomalous])
    return float(torch.quantile(errors, quantile)) * 1.5


def main(argv: list[str] | None = None) -> int:
    from models.artifact import save_artifact
    from models.export import export_artifact

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/artifacts/anomaly"))
    parser.add_argument("--version", default="1")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    train, test = sensor_windows(args.seed, 4000), sensor_windows(args.seed + 1, 1000, anomaly_fraction=0.2)
    model = anomaly_autoencoder()
    losses = train_single_process(model, train, seed=args.seed)
    threshold = fit_threshold(model, train)
    flagged = reconstruction_error(model, test.x) > threshold
    recall = float(flagged[test.anomalous].float().mean())
    false_alarms = float(flagged[~test.anomalous].float().mean())
    print(
        f"final loss {losses[-1]:.5f}  threshold {threshold:.5f}  recall {recall:.3f}  "
        f"false alarms {false_alarms:.3f}"
    )
    artifact = export_artifact(
        model,
        train.x[:1],
        name="anomaly",
        version=args.version,
        input_spec=INPUT_SPEC,
        postprocess="reconstruction_error",
        labels=["normal", "anomaly"],
        threshold=threshold,
        notes={"recall": recall, "false_alarm_rate": false_alarms},
    )
    save_artifact(args.out, artifact)
    print(f"wrote {args.out} ({artifact.metadata.size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
