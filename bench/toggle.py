"""Toggle-rate item selection on digits: sample-gradients to reach a target test accuracy.

Baseline (same run): uniform training, every epoch a fresh shuffle of the whole training set.
Ours: each epoch trains on ``fraction`` of the items chosen by ``ToggleSampler`` from the merged
toggle state (world size 1: the same code a multi-rank job runs, with one shard). Both evaluate
test accuracy every ``eval_every`` samples; a run's figure is the samples trained on when accuracy
first reaches the target. Ratio ``samples_vs_uniform`` = uniform samples / ours (higher is better).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Results, parse_args  # noqa: E402
from cloud.training.data.sampler import ToggleSampler  # noqa: E402
from cloud.training.data.toggle import ToggleTracker  # noqa: E402
from models.digits import accuracy, digits_cnn, load_digits_split  # noqa: E402

BATCH, LR, EVAL_EVERY = 32, 0.05, 128


def run(system: str, seed: int, target: float, max_samples: int, fraction: float,
        floor: float) -> tuple[int, float]:
    split = load_digits_split(seed)
    torch.manual_seed(seed)
    model = digits_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    n = len(split.train_y)
    tracker = ToggleTracker(n)
    sampler = ToggleSampler(n, fraction=fraction, floor=floor, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    samples, next_eval, epoch = 0, EVAL_EVERY, 0
    while samples < max_samples:
        if system == "uniform":
            order = torch.randperm(n, generator=generator)
        else:
            sampler.set_epoch(epoch, tracker.merge() if epoch else None)
            order = torch.tensor(list(sampler))
        for start in range(0, len(order), BATCH):
            index = order[start:start + BATCH]
            optimizer.zero_grad()
            logits = model(split.train_x[index])
            loss_fn(logits, split.train_y[index]).backward()
            optimizer.step()
            tracker.record(index, logits.argmax(dim=1) == split.train_y[index])
            samples += len(index)
            if samples >= next_eval:
                next_eval += EVAL_EVERY
                if accuracy(model, split.test_x, split.test_y) >= target:
                    return samples, accuracy(model, split.test_x, split.test_y)
        epoch += 1
    return samples, accuracy(model, split.test_x, split.test_y)


def main() -> None:
    args = parse_args(__doc__)
    torch.set_num_threads(1)
    seeds = range(3) if args.quick else range(8)
    target, fraction, floor = 0.96, 0.5, 0.1
    results = Results("toggle", args.quick)
    case = f"digits cnn, target acc {target}, {len(seeds)} seeds"
    medians = {}
    started = time.perf_counter()
    for system in ("uniform", "toggle_rate"):
        runs = [run(system, seed, target, 20 * 1437, fraction, floor) for seed in seeds]
        medians[system] = statistics.median(samples for samples, _ in runs)
        results.add(case, system, "sample_gradients_to_target", medians[system])
        results.add(case, system, "final_test_accuracy", statistics.mean(acc for _, acc in runs))
        results.add(case, system, "runs_reaching_target", sum(acc >= target for _, acc in runs))
    results.add(case, "toggle_rate", "fraction_per_epoch", fraction)
    results.add(case, "toggle_rate", "exploration_floor", floor)
    results.ratio("samples_vs_uniform", medians["uniform"], medians["toggle_rate"])
    results.add(case, "both", "bench_seconds", time.perf_counter() - started)
    results.write()


if __name__ == "__main__":
    main()
