"""Turn a finished job's per-stage checkpoints into a registry artifact (ONNX + metadata).

Runs as its own process (``python -m cloud.jobs.export``) so that cloudd's event loop neither
imports torch nor spends CPU on the export: the manager starts it, waits (bounded) and reads
the artifact folder it wrote.

A model factory's model (``export_factory``) is exported like the built-ins, its input shaped as the
dataset's x and its output read by its loss: ``cross_entropy`` -> ``softmax_labels`` (labels
"0".."C-1"), ``reconstruction`` -> ``reconstruction_error`` (threshold: 1.5 x the 99.5th
percentile of the training rows' errors). A loss the registry has no postprocess for (``mse``) or
a model ONNX cannot express fails the export with one line saying so and where the trained
weights are (the job's checkpoints): the registry holds ONNX versions only.

Invariant: an artifact is written only from the latest step for which EVERY stage has a checkpoint
(the model is whole), and only if ``models.export.export_artifact`` found onnxruntime equal to
torch; the lineage given travels in ``metadata.notes["lineage"]``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cloud.jobs.spec import JobSpec, is_factory
from cloud.training import checkpoint
from cloud.training.jobfile import JobError, build_model
from models.artifact import ArtifactError, ModelArtifact, save_artifact

_STAGE_RE = re.compile(r"^stage(\d+)$")


def assemble(model: nn.Sequential, checkpoint_dir: Path) -> int:
    """Load every stage's state of the latest complete step into ``model``; returns that step."""
    stages = sorted(int(m.group(1)) for m in (_STAGE_RE.match(p.name) for p in checkpoint_dir.iterdir()) if m)
    if not stages or stages != list(range(len(stages))):
        raise ValueError(f"{checkpoint_dir}: stage folders {stages} are not 0..n-1")
    step = checkpoint.latest_complete_step(checkpoint_dir, len(stages))
    if step is None:
        raise ValueError(f"{checkpoint_dir}: no step has a checkpoint for all {len(stages)} stages")
    merged: dict[str, torch.Tensor] = {}
    for stage in stages:
        merged.update(checkpoint.load_stage(checkpoint_dir, stage, step)["model"])
    # Stage modules are slices of the whole Sequential, so their keys are the whole model's keys.
    model.load_state_dict(merged, strict=True)
    return step


def export_digits(workdir: Path, spec: JobSpec, version: str, lineage: dict[str, Any]) -> ModelArtifact:
    from models.digits import accuracy, digits_cnn, load_digits_split
    from models.export import export_artifact

    model = digits_cnn()
    step = assemble(model, workdir / "checkpoints")
    split = load_digits_split(spec.seed)
    test_accuracy = accuracy(model, split.test_x, split.test_y)
    input_spec = {"name": "input", "shape": [None, 1, 8, 8], "dtype": "float32", "preprocess": "none"}
    return export_artifact(
        model,
        split.test_x[:1],
        name=spec.model_name,
        version=version,
        input_spec=input_spec,
        postprocess="softmax_labels",
        labels=[str(d) for d in range(10)],
        notes={"test_accuracy": test_accuracy, "step": step, "lineage": lineage},
    )


def export_anomaly(workdir: Path, spec: JobSpec, version: str, lineage: dict[str, Any]) -> ModelArtifact:
    from models.anomaly import INPUT_SPEC, WindowData, anomaly_autoencoder, fit_threshold
    from models.export import export_artifact

    model = anomaly_autoencoder()
    step = assemble(model, workdir / "checkpoints")
    data = torch.load(workdir / "dataset.pt", weights_only=True)
    x = data["x"]
    windows = WindowData(x, torch.zeros(len(x), dtype=torch.bool))
    threshold = fit_threshold(model, windows)
    return export_artifact(
        model,
        x[:1],
        name=spec.model_name,
        version=version,
        input_spec=INPUT_SPEC,
        postprocess="reconstruction_error",
        labels=["normal", "anomaly"],
        threshold=threshold,
        notes={"step": step, "train_windows": len(x), "lineage": lineage},
    )


def export_scene(workdir: Path, spec: JobSpec, version: str, lineage: dict[str, Any]) -> ModelArtifact:
    from models.export import export_artifact
    from models.scene import INPUT_SPEC, LABELS, SceneData, accuracy, scene_cnn

    model = scene_cnn()
    step = assemble(model, workdir / "checkpoints")
    data = torch.load(workdir / "dataset.pt", weights_only=True)
    # the share of the training rows whose label (camera_frames: the gateway model's verdict; an
    # upload: the uploader's, e.g. the scene's truth) the new model repeats
    agreement = accuracy(model, SceneData(data["x"], data["y"]))
    return export_artifact(
        model,
        data["x"][:1],
        name=spec.model_name,
        version=version,
        input_spec=INPUT_SPEC,
        postprocess="softmax_labels",
        labels=list(LABELS),
        notes={
            "step": step,
            "train_frames": len(data["x"]),
            "label_agreement": agreement,
            "lineage": lineage,
        },
    )


def _factory_data(workdir: Path, spec: JobSpec) -> torch.Tensor:
    if spec.dataset_name == "digits":
        from models.digits import load_digits_split

        return load_digits_split(spec.seed).train_x
    return torch.load(workdir / "dataset.pt", weights_only=True)["x"]


def export_factory(workdir: Path, spec: JobSpec, version: str, lineage: dict[str, Any]) -> ModelArtifact:
    from models.anomaly import reconstruction_error
    from models.export import export_artifact

    model = build_model(spec.trainer_model)
    step = assemble(model, workdir / "checkpoints")
    x = _factory_data(workdir, spec)
    input_spec = {"name": "input", "shape": [None, *x.shape[1:]], "dtype": "float32", "preprocess": "none"}
    notes = {"step": step, "train_rows": len(x), "factory": spec.model, "lineage": lineage}
    loss = spec.data_loss
    if loss == "cross_entropy":
        model.eval()
        with torch.no_grad():
            classes = model(x[:1]).shape[-1]
        reads: dict[str, Any] = {"postprocess": "softmax_labels", "labels": [str(c) for c in range(classes)]}
    elif loss == "reconstruction":
        threshold = float(torch.quantile(reconstruction_error(model, x.flatten(1)), 0.995)) * 1.5
        reads = {
            "postprocess": "reconstruction_error",
            "labels": ["normal", "anomaly"],
            "threshold": threshold,
        }
    else:
        raise ValueError(
            f"loss {loss}: the registry has no postprocess for a regression (softmax_labels or "
            "reconstruction_error)"
        )
    return export_artifact(
        model, x[:1], name=spec.model_name, version=version, input_spec=input_spec, notes=notes, **reads
    )


Exporter = Callable[[Path, JobSpec, str, dict[str, Any]], ModelArtifact]
EXPORTERS: dict[str, Exporter] = {  # by ModelName
    "digits_cnn": export_digits,
    "anomaly_autoencoder": export_anomaly,
    "scene_cnn": export_scene,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="export a finished job's model")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    spec = JobSpec.model_validate_json((args.workdir / "spec.json").read_text())
    lineage = json.loads((args.workdir / "lineage.json").read_text())
    exporter = export_factory if is_factory(spec.model) else EXPORTERS[spec.model]
    try:
        artifact = exporter(args.workdir, spec, args.version, lineage)
    except (ValueError, ArtifactError, OSError, JobError) as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # torch.onnx's own errors: the model uses what ONNX cannot express
        print(
            f"export failed: the model trained (its weights: {args.workdir / 'checkpoints'}) but ONNX "
            f"export failed, so no version is registered (the registry holds ONNX models): "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            file=sys.stderr,
        )
        return 1
    save_artifact(args.out, artifact)
    print(f"exported {artifact.name}@{artifact.version} ({artifact.metadata.size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
