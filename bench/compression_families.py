"""The model-family suite of bench/compression.py: compression on models and data it was not tuned on.

Five families, each on data the bench generates (seeded, so every run sees the same sets):
- ``mlp`` on a tabular set (sklearn's ``make_classification``: 24 features, 4 classes, clusters);
- ``cnn2d`` (two Conv2d + BatchNorm + ReLU + MaxPool2d blocks) on 16x16 images of noisy shapes;
- ``conv1d`` (two Conv1d + ReLU + MaxPool1d blocks, dropout) on series of 64 samples of noisy
  waveforms (sine, square, sawtooth, chirp);
- ``gru`` (one GRU of 32 units, its last state classified) on the same series;
- ``transformer`` (one ``TransformerEncoderLayer``, d_model 32, 4 heads, over 16 patches of 4
  samples) on the same series.
Settings per family: ``fp32``; fixed formats (``bfp8``, ``bfp4``, every layer); ``adaptive`` (what
a user's model gets: recurrent layers recomputed in backward, the Gist pass where the model traces,
then the adaptive controller with its default settings).
Each setting trains with the same seeds (initialisation and batch order paired with fp32's), Adam,
``fit_compressed``; accuracy is on a held-out split, saved bytes are counted on one step of a
fixed batch, step time is the per-step CPU time as bench/compression.py measures it, per seed;
a case's ``step_ms`` is the least of its seeds' (``step_ms_per_seed`` has all three). Other jobs
on a shared machine only ever add time, and an MLP seed's timed steps last ~0.1 s: the median of
three such windows still moved 0.5-1.0x between fp32 and a case that computes the same thing (on
2026-12-03, the MLP's adaptive step runs without hooks), the least of three is the one a load
burst spared.

Invariant: every figure a family reports comes from the same code path a user's model takes
(``fit_compressed``, ``ActivationCompressor``, ``AdaptiveController``, ``gist_transform``); the
bench adds only data, models and timing.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
from torch import nn

FAMILY_CASES = ("fp32", "bfp8", "bfp4", "adaptive")
SEEDS = 3
TEST_FRACTION = 0.3
SERIES_LENGTH = 64


@dataclass(frozen=True)
class Dataset:
    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: int


def _split(name: str, x: torch.Tensor, y: torch.Tensor, classes: int) -> Dataset:
    n_test = int(len(y) * TEST_FRACTION)
    return Dataset(name, x[n_test:], y[n_test:], x[:n_test], y[:n_test], classes)


def tabular(n: int) -> Dataset:
    from sklearn.datasets import make_classification

    x, y = make_classification(
        n_samples=n, n_features=24, n_informative=12, n_classes=4, n_clusters_per_class=2, random_state=0
    )
    x = (x - x.mean(0)) / x.std(0)
    return _split("tabular", torch.tensor(x, dtype=torch.float32), torch.tensor(y), 4)


def shapes(n: int, size: int = 16) -> Dataset:
    """Noisy images of four shapes (filled square, ring, cross, diagonal bar), random size and place."""
    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, 4, (n,), generator=g)
    rows = torch.arange(size).view(1, -1, 1).float()
    cols = torch.arange(size).view(1, 1, -1).float()
    centre = torch.randint(5, size - 5, (n, 2), generator=g).float()
    radius = torch.randint(3, 5, (n,), generator=g).float().view(-1, 1, 1)
    dr, dc = rows - centre[:, 0].view(-1, 1, 1), cols - centre[:, 1].view(-1, 1, 1)
    distance = (dr**2 + dc**2).sqrt()
    masks = torch.stack(
        [
            (dr.abs() <= radius) & (dc.abs() <= radius),
            (distance - radius).abs() < 0.9,
            ((dr.abs() < 1) & (dc.abs() <= radius)) | ((dc.abs() < 1) & (dr.abs() <= radius)),
            ((dr - dc).abs() < 1.2) & (dr.abs() <= radius),
        ]
    )
    image = masks[y, torch.arange(n)].float() + 0.35 * torch.randn(n, size, size, generator=g)
    return _split("images", image.unsqueeze(1), y, 4)


def waveforms(n: int, length: int = SERIES_LENGTH) -> Dataset:
    """Noisy series of four waveforms (sine, square, sawtooth, chirp), random frequency and phase."""
    g = torch.Generator().manual_seed(2)
    y = torch.randint(0, 4, (n,), generator=g)
    t = torch.arange(length).float().view(1, -1) / length
    freq = 2 + 3 * torch.rand(n, 1, generator=g)
    phase = 2 * math.pi * torch.rand(n, 1, generator=g)
    angle = 2 * math.pi * freq * t + phase
    waves = torch.stack(
        [
            torch.sin(angle),
            torch.sign(torch.sin(angle)),
            2 * torch.remainder(angle / (2 * math.pi), 1.0) - 1,
            torch.sin(2 * math.pi * freq * t * (1 + 2 * t) + phase),
        ]
    )
    series = waves[y, torch.arange(n)] + 0.3 * torch.randn(n, length, generator=g)
    return _split("series", series.unsqueeze(1), y, 4)


class _LastState(nn.Module):
    """GRU over (N, 1, L) series, classifying the last hidden state."""

    def __init__(self, classes: int, hidden: int = 32) -> None:
        super().__init__()
        self.gru = nn.GRU(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x.transpose(1, 2))
        return self.head(out[:, -1])


class _PatchTransformer(nn.Module):
    """One transformer encoder layer over non-overlapping patches of a (N, 1, L) series."""

    def __init__(self, classes: int, patch: int = 4, width: int = 32) -> None:
        super().__init__()
        self.patch = patch
        self.embed = nn.Linear(patch, width)
        self.position = nn.Parameter(torch.zeros(1, SERIES_LENGTH // patch, width))
        self.encoder = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, batch_first=True)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = x.reshape(x.shape[0], -1, self.patch)
        return self.head(self.encoder(self.embed(patches) + self.position).mean(dim=1))


def family_model(family: str, classes: int) -> nn.Module:
    if family == "mlp":
        return nn.Sequential(
            nn.Linear(24, 128),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Linear(128, 128),
            nn.ReLU(),
            nn.Linear(128, classes),
        )
    if family == "cnn2d":
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 4 * 4, classes),
        )  # fmt: skip
    if family == "conv1d":
        return nn.Sequential(
            nn.Conv1d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
            nn.Flatten(), nn.Dropout(0.1), nn.Linear(32 * SERIES_LENGTH // 4, classes),
        )  # fmt: skip
    if family == "gru":
        return _LastState(classes)
    if family == "transformer":
        return _PatchTransformer(classes)
    raise ValueError(f"family: unknown {family!r}")


# family -> (dataset, epochs, batch, lr) per size (quick, full)
FAMILIES = {
    "mlp": ("tabular", {True: 4, False: 12}, 64, 2e-3),
    "cnn2d": ("images", {True: 3, False: 8}, 64, 2e-3),
    "conv1d": ("series", {True: 3, False: 8}, 64, 2e-3),
    "gru": ("series", {True: 3, False: 8}, 64, 5e-3),
    "transformer": ("series", {True: 4, False: 10}, 64, 2e-3),
}
DATA_SIZES = {True: 1600, False: 4000}  # samples per dataset, 30% held out


def load_datasets(quick: bool) -> dict[str, Dataset]:
    n = DATA_SIZES[quick]
    return {d.name: d for d in (tabular(n), shapes(n), waveforms(n))}


def _setup(case: str, model: nn.Module):  # -> (model, compressor | None, controller | None)
    from cloud.training.compression import (
        ActivationCompressor,
        AdaptiveController,
        ControllerSettings,
        LayerPolicy,
        gist_transform,
        leaf_names,
        propagating_layers,
        recompute_recurrent,
    )
    from models.numerics import BfpFormat

    if case == "fp32":
        return model, None, None
    if case == "adaptive":
        model = recompute_recurrent(model)  # the rule for recurrent layers (recompute.py)
        ssdc: frozenset[str] = frozenset()
        try:
            model, plan = gist_transform(model)
            ssdc = plan.ssdc_layers
        except (torch.fx.proxy.TraceError, TypeError):  # not traceable: no Gist, DPR only
            pass
        layers = leaf_names(model)
        controller = AdaptiveController(
            layers, ControllerSettings(), propagating=propagating_layers(model, layers)
        )
        return model, ActivationCompressor(model, controller.policy, ssdc_layers=ssdc), controller
    bits = {"bfp8": 8, "bfp4": 4}[case]
    return model, ActivationCompressor(model, LayerPolicy.uniform(BfpFormat(mantissa_bits=bits))), None


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def run_family_case(family: str, case: str, data: Dataset, quick: bool, step_time, warmup: int) -> dict:
    """Trains ``family`` under ``case`` for each seed; the figures bench/compression.py records."""
    from cloud.training.compression import fit_compressed, shuffled_batches

    _, epochs, batch, lr = FAMILIES[family]
    accuracies, cpu, decisions = [], [], 0
    for seed in range(SEEDS):
        torch.manual_seed(seed)
        model, compressor, controller = _setup(case, family_model(family, data.classes))
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        result = fit_compressed(
            model,
            shuffled_batches(data.train_x, data.train_y, batch, seed),
            nn.functional.cross_entropy,
            optimizer,
            compressor=compressor,
            controller=controller,
            epochs=epochs[quick],
            evaluate=lambda m, _: _accuracy(m, data.test_x, data.test_y),
        )
        accuracies.append(result.evaluations[-1])
        cpu.append(step_time(result.step_cpu_s, result.probe_steps, warmup))
        decisions += len(controller.decisions) if controller else 0
    counter = counted_step(model, compressor, controller, data.train_x[:batch], data.train_y[:batch])
    return {
        "saved_bytes": counter.total().stored,
        "accuracy": statistics.mean(accuracies),
        "accuracies": [round(a, 4) for a in accuracies],
        "step_ms": min(cpu) * 1e3,
        "step_ms_per_seed": [round(t * 1e3, 4) for t in cpu],
        "decisions": decisions,
        "formats": {} if controller is None else controller.status()["formats"],
    }


def counted_step(model: nn.Module, compressor, controller, x: torch.Tensor, y: torch.Tensor):
    """The compressor (for fp32, one that keeps every tensor as it is) after one counted step on
    (x, y), under the controller's final policy: what a case's ``saved_bytes`` and
    ``peak_saved_bytes`` are read from (bench/compression.py's cases and the families alike)."""
    from cloud.training.compression import ActivationCompressor, LayerPolicy, count_saved_bytes

    counter = compressor or ActivationCompressor(model, LayerPolicy(), mask_bits=False)
    if controller is not None:
        counter.policy = controller.policy
    return count_saved_bytes(model, counter, x, y)


def family_ratios(measured: dict[tuple[str, str], dict]) -> dict[str, float]:
    """Per family (adaptive against fp32) and the summary figures over families."""
    ratios: dict[str, float] = {}
    for family in FAMILIES:
        base = measured[family, "fp32"]
        for case in FAMILY_CASES[1:]:
            ours = measured[family, case]
            suffix = "" if case == "adaptive" else f"[{case}]"
            ratios[f"family_{family}_accuracy_drop_pp{suffix}"] = 100 * (base["accuracy"] - ours["accuracy"])
            ratios[f"family_{family}_saved_bytes_reduction{suffix}"] = (
                base["saved_bytes"] / ours["saved_bytes"]
            )
            ratios[f"family_{family}_step_time_vs_fp32{suffix}"] = base["step_ms"] / ours["step_ms"]
    ratios["worst_family_accuracy_drop_pp"] = max(ratios[f"family_{f}_accuracy_drop_pp"] for f in FAMILIES)
    for name in ("saved_bytes_reduction", "step_time_vs_fp32"):
        ratios[f"median_family_{name}"] = statistics.median(ratios[f"family_{f}_{name}"] for f in FAMILIES)
    return ratios
