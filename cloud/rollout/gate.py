"""The quality gate's mechanism: run a new version and the version it would replace (the name's
production) with onnxruntime on held-out data the training never saw, and write the evaluation.

Held-out data (``HeldOut``): for a ``digits`` job, the digits test split of the job's seed (20%); for
a job on a tensor file (uploaded camera frames, sensor windows, an uploaded dataset), exactly the
rows the job held out (``cloud.training.data.stream.split_rows``: its ``test_fraction`` with its seed; for
``camera_frames`` 20% of the uploaded frames, labelled as the frames were, by the gateway model's
verdicts); for a federated round, the digits test split of seed 0 (federated clients train on their
gateways' own samples). Runs as a process of its own (``python -m cloud.rollout.gate``) so that
cloudd's event loop imports neither torch nor onnxruntime; the federated coordinator calls
``evaluate`` on its own thread.

For a classifier compared with a baseline the evaluation also carries ``live``: both versions' mean
confidence and their agreement on those rows, what the rollout controller expects to see live
(cloud/rollout/health.py ``Expected``).

Invariant: both versions are scored on the same rows against the same truth (label names: the
dataset's, else as the job's export named its classes), so the comparison is like for like and a
version whose outputs are named wrongly scores as wrong; a baseline that cannot run on those rows
is reported and not compared against.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cloud.rollout.verdict import GateConfig, Metric, evaluation_document
from models.artifact import ArtifactError, ModelArtifact, load_artifact
from models.inference import load_and_probe, postprocess

BATCH = 256


@dataclass(frozen=True)
class HeldOut:
    x: np.ndarray  # rows as the model takes them (already preprocessed)
    y: np.ndarray | None  # class indices; None: reconstruction
    dataset: str  # what the rows are, for the evaluation document
    labels: list[str] | None = None  # the names of y's classes; None: as the candidate names them


def digits_held_out(seed: int) -> HeldOut:
    from models.digits import load_digits_split

    split = load_digits_split(seed)
    what = f"digits test split (seed {seed}, 20%)"
    return HeldOut(split.test_x.numpy(), split.test_y.numpy(), what, [str(d) for d in range(10)])


def job_held_out(workdir: Path) -> HeldOut:
    """The rows the job in ``workdir`` held out from training."""
    import torch

    from cloud.jobs.spec import JobSpec
    from cloud.training.data.stream import split_rows

    spec = JobSpec.model_validate_json((workdir / "spec.json").read_text())
    if spec.dataset_name == "digits":
        return digits_held_out(spec.seed)
    tensors = torch.load(workdir / "dataset.pt", weights_only=True)
    x = tensors["x"]
    fraction = spec.data_test_fraction
    test, _ = split_rows(len(x), fraction, spec.seed)
    y = tensors["y"][test].numpy() if spec.data_loss == "cross_entropy" else None
    what = f"{spec.dataset_name}: the job's held-out {fraction:.0%} (seed {spec.seed}) of {len(x)} rows"
    labels = None
    if spec.dataset_name == "camera_frames":
        from models.scene import LABELS  # cloud.jobs.datasets labels frames by this list

        labels = list(LABELS)
    return HeldOut(x[test].numpy().astype(np.float32), y, what, labels)


def balanced_accuracy(predicted: list[str], truth: list[str]) -> float:
    """The mean over the classes present in ``truth`` of the share of their rows predicted right: a
    camera that sees mostly one scene would otherwise pass a model that always answers it."""
    rows_of: dict[str, list[bool]] = {}
    for label, want in zip(predicted, truth, strict=True):
        rows_of.setdefault(want, []).append(label == want)
    return sum(sum(hits) / len(hits) for hits in rows_of.values()) / len(rows_of) if rows_of else math.nan


def verdicts(artifact: ModelArtifact, held: HeldOut) -> list[tuple[str, float]]:
    """(label, score) per held-out row, as the gateway would answer (models.inference.postprocess)."""
    model = load_and_probe(artifact, threads=1)
    metadata = artifact.metadata
    answers: list[tuple[str, float]] = []
    for start in range(0, len(held.x), BATCH):
        rows = held.x[start : start + BATCH]
        outputs = model.session.run([metadata.output_name], {metadata.input.name: rows})[0]
        answers.extend(postprocess(artifact, rows, outputs))
    return answers


def score(
    artifact: ModelArtifact, answers: list[tuple[str, float]], truth: list[str] | None
) -> tuple[Metric, float]:
    """(metric, value) of ``artifact``'s ``answers``: accuracy against ``truth`` (label names per row),
    or the mean reconstruction error."""
    if artifact.metadata.postprocess == "softmax_labels":
        if truth is None:
            raise ArtifactError("no_labels", "a classifier needs labelled held-out rows")
        return "accuracy", balanced_accuracy([label for label, _ in answers], truth)
    errors = [error for _, error in answers]
    return "loss", float(np.mean(errors)) if errors else math.nan


def live_expectation(
    candidate: list[tuple[str, float]], baseline: list[tuple[str, float]]
) -> dict[str, float]:
    """What the rollout controller should expect live of a classifier against the version it replaces,
    measured here on the same rows (cloud/rollout/health.py ``Expected``): both mean confidences and
    the share of rows on which they give the same verdict (the gateway's shadow agreement)."""
    same = sum(1 for (mine, _), (theirs, _) in zip(candidate, baseline, strict=True) if mine == theirs)
    return {
        "confidence_mean": float(np.mean([c for _, c in candidate])),
        "baseline_confidence_mean": float(np.mean([c for _, c in baseline])),
        "agreement_with_baseline": same / len(candidate),
    }


def evaluate(
    candidate: ModelArtifact,
    baseline: ModelArtifact | None,
    held: HeldOut,
    config: GateConfig,
) -> dict[str, Any]:
    labels = held.labels or candidate.metadata.labels
    truth = [labels[i] for i in held.y] if held.y is not None else None
    rows = len(held.x)
    note = None
    answers: list[tuple[str, float]] = []
    try:
        answers = verdicts(candidate, held) if rows else []
        metric, value = score(candidate, answers, truth) if rows else ("accuracy", math.nan)
    except ArtifactError as exc:
        if exc.reason != "probe_failed":
            raise
        # A model whose outputs are not finite (a diverged job) is a verdict, not a gate failure: it is
        # registered, never promotable (verdict.py: a value that is not finite never is).
        metric = "accuracy" if candidate.metadata.postprocess == "softmax_labels" else "loss"
        value, note = math.nan, f"the candidate cannot run: {exc.detail}"
    compared: tuple[str, float] | None = None
    expected: dict[str, float] = {}
    if baseline is not None and rows:
        try:
            base_answers = verdicts(baseline, held)
            base_metric, base_value = score(baseline, base_answers, truth)
        except (ArtifactError, ValueError, RuntimeError) as exc:  # onnxruntime: shapes that do not fit
            note = f"baseline {baseline.version} cannot run on these rows: {str(exc)[:200]}"
        else:
            if base_metric == metric and math.isfinite(base_value):
                compared = (baseline.version, base_value)
                if metric == "accuracy" and answers:
                    expected = live_expectation(answers, base_answers)
    document = evaluation_document(metric, value, held.dataset, rows, compared, len(labels), config)
    if expected:
        document["live"] = expected
    if note:
        document["reason"] += f"; {note}"
    return document


def gate_command(
    workdir: Path, candidate: Path, baseline: Path | None, config: GateConfig, out: Path
) -> list[str]:
    """The command line of this module that the job manager runs after a job's export."""
    return [
        sys.executable,
        "-m",
        "cloud.rollout.gate",
        "--workdir",
        str(workdir),
        "--candidate",
        str(candidate),
        *(["--baseline", str(baseline)] if baseline is not None else []),
        "--tolerance",
        str(config.tolerance),
        "--floor-over-chance",
        str(config.floor_over_chance),
        "--out",
        str(out),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="evaluate a job's exported version against production")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--candidate", type=Path, required=True, help="the exported artifact folder")
    parser.add_argument("--baseline", type=Path, help="the production version's registry folder")
    parser.add_argument("--tolerance", type=float, default=GateConfig.tolerance)
    parser.add_argument("--floor-over-chance", type=float, default=GateConfig.floor_over_chance)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        config = GateConfig(args.tolerance, args.floor_over_chance)
        candidate = load_artifact(args.candidate)
        baseline = load_artifact(args.baseline) if args.baseline else None
        document = evaluate(candidate, baseline, job_held_out(args.workdir), config)
    except (ArtifactError, ValueError, OSError, KeyError) as exc:
        print(f"gate failed: {exc}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(document))
    print(f"gate: {document['reason']} -> promotable={document['promotable']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
