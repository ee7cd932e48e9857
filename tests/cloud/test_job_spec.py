"""The job spec users submit: every field checked with its name in the error, the job file it becomes
(loaded by the trainer's own loader), and cloudctl's flags and --file shaping it."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from cloud.ctl.main import build_parser
from cloud.ctl.train import spec_from_args
from cloud.jobs.spec import JobSpec, SpecError, job_toml, parse_spec
from cloud.jobs.spec_toml import section_lines
from cloud.training.compression.wire_codec import WIRE_CODEC_NAMES
from cloud.training.jobfile import load_job
from cloud.training.options import CompressionOptions
from tests.harness.processes import repo_env


def parse(spec: dict, **options) -> JobSpec:
    return parse_spec(spec, max_nproc=4, **options)


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"model": "resnet"}, "model: 'resnet' is neither"),
        ({"model": "pkg.mod:fn"}, "dataset: a model factory needs a dataset"),
        ({"model": "pkg.mod:fn", "dataset": "upload:a b"}, "dataset: 'upload:a b'"),
        ({"pythonpath": "/tmp"}, "pythonpath: applies only to a model factory"),
        (
            {"model": "m:f", "dataset": "digits", "pythonpath": "rel/dir"},
            "pythonpath: 'rel/dir' must be an absolute",
        ),
        (
            {"model": "m:f", "dataset": "digits", "pythonpath": "/no/such/dir"},
            "pythonpath: /no/such/dir is not",
        ),
        ({"model": "digits_cnn", "dataset": "camera_frames"}, "dataset: model digits_cnn trains on"),
        ({"model": "digits_cnn", "loss": "mse"}, "loss: the built-in model"),
        ({"model": "m:f", "dataset": "digits", "loss": "mse"}, "loss: dataset digits is classification"),
        ({"model": "m:f", "dataset": "digits", "test_fraction": 0.1}, "test_fraction: dataset digits"),
        (
            {"model": "m:f", "dataset": "upload:d", "test_fraction": 1.0},
            "test_fraction: Input should be less",
        ),
        ({"nproc": 8}, "nproc: 8 > this cloudd's limit 4"),
        ({"stages": 0}, "stages: must be 'auto'"),
        ({"stages": 3}, "stages: nproc 2 does not split into 3"),
        ({"replicas": [1, 2]}, "replicas: [1, 2] add up to 3, not nproc 2"),
        ({"stages": 1, "replicas": [1, 1]}, "replicas: 2 counts for 1 stages"),
        ({"replicas": [2, 0]}, "replicas: must be 'auto'"),
        ({"schedule": "1f1b-stash", "replicas": [2]}, "replicas: schedule 1f1b-stash runs straight"),
        ({"vertical_sync": True}, "vertical_sync: applies only to schedule 1f1b-stash"),
        ({"batch_size": 10}, "batch_size: must be a multiple of microbatches"),
        ({"wire_codec": "zip"}, "wire_codec: Input should be"),
        ({"precision": "fp16"}, "precision: Input should be"),
        ({"device": "tpu"}, "device: Input should be"),
        ({"compression": {"activations": "bfp4"}}, "compression.activations: Input should be"),
        ({"compression": {"window": 0}}, "compression.window: Input should be greater"),
        ({"compression": {"controller": {"tighten_rungs": 0}}}, "compression.controller.tighten_rungs"),
        (
            {"compression": {"activations": "adaptive", "window": 5}, "log_every": 2},
            "compression.window: must",
        ),
        ({"sync": {"window": 0}}, "sync.window: Input should be greater"),
        ({"sync": {"enabled": True}, "replicas": [1, 1]}, "sync.enabled: needs a replicated stage"),
        ({"balance": {"enabled": True}, "nproc": 1}, "balance.enabled: needs a replicated stage"),
        ({"balance": {"alpha": 2}}, "balance.alpha: Input should be less"),
        ({"toggle": {"fraction": 0}}, "toggle.fraction: Input should be greater"),
        ({"toggle": {"colour": 1}}, "toggle.colour: Extra inputs"),
        ({"gateways": ["gw1"]}, "gateways: applies only to datasets built from gateways"),
        ({"registry_name": "a b"}, "registry_name: String should match"),
    ],
)
def test_every_bad_field_is_named(spec, field):
    with pytest.raises(SpecError) as caught:
        parse(spec)
    assert str(caught.value).startswith(field), str(caught.value)


def test_unknown_upload_is_refused_at_submission():
    spec = {"model": "m:f", "dataset": "upload:nope"}
    with pytest.raises(SpecError, match=r"dataset: no uploaded dataset 'nope' \(cloudctl datasets upload"):
        parse(spec, upload_exists=lambda name: False)
    assert parse(spec, upload_exists=lambda name: name == "nope").upload == "nope"


def test_factory_defaults_and_wire_codecs_match_the_trainer():
    spec = parse({"model": "tinymods.nets:tiny_mlp", "dataset": "upload:blobs"})
    assert (spec.model_name, spec.trainer_model, spec.data_loss, spec.data_test_fraction) == (
        "tiny_mlp",
        "tinymods.nets:tiny_mlp",
        "cross_entropy",
        0.2,
    )
    assert parse({"model": "digits_cnn"}).model_name == "digits"
    assert JobSpec.model_fields["wire_codec"].annotation.__args__ == WIRE_CODEC_NAMES  # type: ignore[union-attr]


def test_job_file_carries_every_option_and_the_trainer_loads_it(tmp_path):
    spec = parse(
        {
            "model": "m:f",
            "dataset": "upload:d",
            "loss": "reconstruction",
            "test_fraction": 0.1,
            "schedule": "gpipe",
            "nproc": 3,
            "replicas": [2, 1],
            "wire_codec": "bfp8",
            "lr": 0.01,
            "log_every": 5,
        }
    )
    job = tomllib.loads(job_toml(spec, layers=5))
    assert job["partition"] == {"mode": "explicit", "stages": [[0, 1], [2, 4]], "replicas": [2, 1]}
    assert job["data"] == {
        "dataset": "tensor_file",
        "path": "dataset.pt",
        "loss": "reconstruction",
        "test_fraction": 0.1,
    }
    assert (job["train"]["schedule"], job["train"]["wire_codec"], job["train"]["lr"]) == (
        "gpipe",
        "bfp8",
        0.01,
    )
    assert job["compression"] == {"activations": "none", "gist": False}  # the features off: no sections
    assert not {"sync", "balance", "toggle"} & set(job)
    (tmp_path / "job.toml").write_text(job_toml(spec, layers=5))
    loaded = load_job(tmp_path / "job.toml")
    assert loaded.partition.replicas == [2, 1] and loaded.data.loss == "reconstruction"

    auto = tomllib.loads(job_toml(JobSpec()))
    assert auto["partition"] == {"mode": "auto", "straight": False} and auto["data"] == {"dataset": "digits"}
    with pytest.raises(ValueError, match="stages: fixed stages need the model's layer count"):
        job_toml(spec)
    with pytest.raises(ValueError, match="stages: 2 layers cannot fill 3 stages"):
        job_toml(parse({"stages": 3, "nproc": 3}), layers=2)


def test_feature_sections_are_written_as_chosen():
    spec = parse(
        {
            "compression": {
                "activations": "adaptive",
                "gist": True,
                "window": 10,
                "controller": {"start_rung": 1},
            },
            "sync": {"enabled": True, "window": 4},
            "balance": {"enabled": True},
            "toggle": {"enabled": True, "fraction": 0.25},
            "precision": "bf16",
            "device": "cpu",
        }
    )
    job = tomllib.loads(job_toml(spec))
    assert job["compression"] == {
        "activations": "adaptive",
        "gist": True,
        "window": 10,
        "controller": {"start_rung": 1},
    }
    assert job["sync"] == {"enabled": True, "window": 4} and job["balance"] == {"enabled": True}
    assert job["toggle"] == {"enabled": True, "fraction": 0.25}
    assert (job["train"]["precision"], job["train"]["device"]) == ("bf16", "cpu")
    # the options classes read back what was written, field for field
    assert CompressionOptions.model_validate(job["compression"]) == spec.compression


def test_section_lines_round_trip():
    values = {"a": True, "b": 2, "c": 0.5, "d": 'say "hi"', "e": [[0, 1]], "f": {"g": 1}}
    assert tomllib.loads("\n".join(section_lines("s", values)))["s"] == values


def ctl_spec(*argv: str) -> dict:
    return spec_from_args(build_parser().parse_args(["train", *argv]))


def test_cloudctl_flags_and_file_make_the_spec(tmp_path):
    assert ctl_spec() == {}  # cloudd's defaults
    spec = ctl_spec(
        "--model", "mods:net", "--pythonpath", str(tmp_path), "--dataset", "upload:d",
        "--schedule", "1f1b-flush", "--stages", "1", "--replicas", "2",
        "--compression", "adaptive+gist", "--sync", "--no-balance",
        "--toggle", "0.5", "--precision", "bf16", "--device", "cpu", "--wire-codec", "bfp6", "--nproc", "2",
    )  # fmt: skip
    assert spec == {
        "model": "mods:net",
        "pythonpath": str(tmp_path),
        "dataset": "upload:d",
        "schedule": "1f1b-flush",
        "stages": 1,
        "replicas": [2],
        "compression": {"activations": "adaptive", "gist": True},
        "sync": {"enabled": True},
        "balance": {"enabled": False},
        "toggle": {"enabled": True, "fraction": 0.5},
        "precision": "bf16",
        "device": "cpu",
        "wire_codec": "bfp6",
        "nproc": 2,
    }
    parse(spec)  # cloudd accepts what cloudctl shaped

    (tmp_path / "spec.toml").write_text('model = "digits_cnn"\nepochs = 3\n[compression]\nwindow = 40\n')
    spec = ctl_spec("--file", str(tmp_path / "spec.toml"), "--epochs", "2", "--compression", "bfp")
    assert spec == {
        "model": "digits_cnn",
        "epochs": 2,
        "compression": {"window": 40, "activations": "bfp", "gist": False},
    }
    (tmp_path / "spec.json").write_text(json.dumps({"nproc": 1}))
    assert ctl_spec("--file", str(tmp_path / "spec.json")) == {"nproc": 1}


def test_cloudd_and_cloudctl_import_no_torch():
    code = (
        "import sys, cloud.server, cloud.ctl, cloud.jobs.spec, cloud.api.uploads; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], env=repo_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_built_in_model_fine_tunes_on_an_upload_of_its_own_rows():
    spec = parse(
        {
            "model": "scene_cnn",
            "dataset": "upload:frames",
            "test_fraction": 0.25,
            "init_from": "production",
            "optimizer": "adam",
            "lr": 0.0005,
        }
    )
    job = tomllib.loads(job_toml(spec))
    assert job["model"] == {"name": "models.scene.scene_cnn", "init": "init.pt"}
    assert job["train"]["optimizer"] == "adam" and job["data"]["test_fraction"] == 0.25
    assert "init" not in tomllib.loads(job_toml(parse({"model": "scene_cnn"})))["model"]
    with pytest.raises(SpecError, match="dataset: model scene_cnn trains on dataset 'camera_frames'"):
        parse({"model": "scene_cnn", "dataset": "digits"})
    with pytest.raises(SpecError, match="optimizer: the sync scheduler"):
        parse({"optimizer": "adam", "sync": {"enabled": True}, "replicas": [2]})


def test_the_warm_start_is_the_versions_weights_or_a_refusal_naming_init_from(tmp_path):
    import numpy as np
    import onnxruntime as ort
    import torch

    from cloud.jobs.prepare import write_init
    from cloud.training.jobfile import JobError
    from models.digits import digits_cnn
    from models.scene import scene_cnn
    from tests.harness.camera import SCENE_ARTIFACT

    onnx_path = SCENE_ARTIFACT / "model.onnx"
    model = scene_cnn()
    write_init(model, onnx_path, tmp_path / "init.pt")
    model.load_state_dict(torch.load(tmp_path / "init.pt", weights_only=True), strict=True)
    model.eval()
    rows = torch.rand(4, 3, 48, 48, generator=torch.Generator().manual_seed(0))
    session = ort.InferenceSession(onnx_path.read_bytes(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"input": rows.numpy()})[0]
    with torch.no_grad():
        assert np.abs(model(rows).numpy() - expected).max() < 1e-4
    with pytest.raises(JobError, match="init_from: the version's weights do not fit"):
        write_init(digits_cnn(), onnx_path, tmp_path / "other.pt")
