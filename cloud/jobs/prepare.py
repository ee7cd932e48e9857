"""A job's prepare step: everything that needs torch before torchrun starts.

``python -m cloud.jobs.prepare --workdir W [--upload FILE]`` (the job manager runs it in the job's
folder, with the spec's ``pythonpath`` on PYTHONPATH):

1. ``--upload``: reads the uploaded dataset (an ``.npz`` or a torch tensor file), checks it with
   ``cloud.jobs.uploads.check_arrays`` (the rules cloudd applies to an ``.npz`` at upload) and
   writes ``W/dataset.pt`` (x as float32; y as int64 class indices or float32 targets);
2. builds the model (``cloud.training.jobfile.build_model``) and runs two rows of the dataset
   through it layer by layer, so a model the pipeline cannot cut fails here, saying what a model
   must look like;
3. ``--init-onnx``: the warm start (``init_from``): the registry version's weights as ``W/init.pt``;
4. writes ``W/job.toml`` (``cloud.jobs.spec.job_toml`` with the model's layer count) and loads it
   as the trainer will, so a job file the trainer would refuse fails here too.

Invariant: exit 0 only with a job file the trainer loads and a dataset file the model takes; any
other outcome is exit 2 with one last line on stderr that names the field (``dataset``, ``model``,
``stages``, ...).
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import numpy as np
import torch

from cloud.jobs.spec import INIT_FILE, JobSpec, job_toml
from cloud.jobs.uploads import DatasetInvalid, check_arrays, detect_format
from cloud.training.jobfile import MODEL_SHAPE, JobError, build_model, load_job

EXIT_BAD_JOB = 2


def _read_upload(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    if detect_format(path) == "npz":
        with np.load(path, allow_pickle=False) as arrays:
            return arrays["x"], arrays["y"] if "y" in arrays.files else None
    try:
        tensors = torch.load(path, weights_only=True, map_location="cpu")
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
        raise DatasetInvalid(f"file: not a readable torch tensor file ({exc})") from None
    if not isinstance(tensors, dict) or not isinstance(tensors.get("x"), torch.Tensor):
        raise DatasetInvalid('file: a torch file must hold {"x": tensor, "y": tensor (optional)}')
    extra = sorted(set(tensors) - {"x", "y"})
    if extra:
        raise DatasetInvalid(f"file: unexpected keys {extra} (a torch file holds x and optionally y)")
    y = tensors.get("y")
    if y is not None and not isinstance(y, torch.Tensor):
        raise DatasetInvalid(f"y: {type(y).__name__}, not a tensor")
    return tensors["x"].numpy(), None if y is None else y.numpy()


def write_dataset(upload: Path, out: Path) -> int:
    """Check the upload and write the trainer's tensor file; returns its rows."""
    x, y = _read_upload(upload)
    facts = check_arrays(x, y)
    tensors = {"x": torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))}
    if y is not None:
        integer = y.dtype.kind in "iu"
        tensors["y"] = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64 if integer else np.float32))
    torch.save(tensors, out)
    return int(facts["rows"])


def check_layers(model: torch.nn.Sequential, sample: torch.Tensor, stages: int) -> None:
    """Each top-level layer takes one tensor and returns one: the pipeline can cut between any two."""
    if len(model) < stages:
        raise JobError(
            f"stages: the model has {len(model)} layers, fewer than {stages} stages; {MODEL_SHAPE}"
        )
    model.eval()
    out = sample
    with torch.no_grad():
        for index, layer in enumerate(model):
            try:
                out = layer(out)
            except Exception as exc:  # the user's layer: any failure is a bad model, said as such
                raise JobError(
                    f"model: layer {index} ({type(layer).__name__}) fails on the output of the layer "
                    f"before ({tuple(out.shape)}): {type(exc).__name__}: {exc}"
                ) from exc
            if not isinstance(out, torch.Tensor):
                raise JobError(
                    f"model: layer {index} ({type(layer).__name__}) returns {type(out).__name__}, not one "
                    f"tensor; {MODEL_SHAPE}"
                )
    model.train()


def _sample(workdir: Path, spec: JobSpec) -> torch.Tensor:
    if spec.dataset_name == "digits":
        from models.digits import load_digits_split

        return load_digits_split(spec.seed).train_x[:2]
    return torch.load(workdir / "dataset.pt", weights_only=True)["x"][:2]


def write_init(model: torch.nn.Sequential, onnx_path: Path, out: Path) -> None:
    """The warm start: the ONNX version's weights (its initializers carry the state-dict keys of the
    model it was exported from) as the model's state dict, every tensor named and shaped as the model's."""
    import onnx
    from onnx import numpy_helper

    try:
        graph = onnx.load(str(onnx_path)).graph
    except (OSError, ValueError) as exc:
        raise JobError(f"init_from: cannot read {onnx_path}: {exc}") from None
    weights = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in graph.initializer}
    state = model.state_dict()
    unfit = [k for k, v in state.items() if k not in weights or weights[k].shape != v.shape]
    if unfit:
        raise JobError(
            "init_from: the version's weights do not fit the model (no tensor shaped as "
            f"{', '.join(unfit[:4])})"
        )
    torch.save({k: weights[k] for k in state}, out)


def prepare(workdir: Path, upload: Path | None, init_onnx: Path | None = None) -> None:
    spec = JobSpec.model_validate_json((workdir / "spec.json").read_text())
    dataset = workdir / "dataset.pt"
    if upload is not None and not dataset.exists():  # a resumed job keeps the file it started with
        try:
            write_dataset(upload, dataset.with_suffix(".tmp"))
        except DatasetInvalid as exc:
            raise JobError(f"dataset: upload {spec.upload!r}: {exc}") from None
        dataset.with_suffix(".tmp").replace(dataset)
    torch.manual_seed(spec.seed)
    model = build_model(spec.trainer_model)
    check_layers(model, _sample(workdir, spec), len(spec.replica_counts or [1]))
    if init_onnx is not None:
        write_init(model, init_onnx, workdir / INIT_FILE)
    try:
        text = job_toml(spec, layers=len(model))
    except ValueError as exc:
        raise JobError(str(exc)) from None
    (workdir / "job.toml").write_text(text)
    load_job(workdir / "job.toml")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="prepare a job: dataset file, model check, job file")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--upload", type=Path, help="the uploaded dataset file the job names")
    parser.add_argument("--init-onnx", type=Path, help="the registry version (model.onnx) to start from")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        prepare(args.workdir, args.upload, args.init_onnx)
    except JobError as exc:
        print(f"invalid job: {exc}", file=sys.stderr)
        return EXIT_BAD_JOB
    print(f"prepared {args.workdir / 'job.toml'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
