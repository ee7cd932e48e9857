"""The job file's feature sections (``cloud.training.options``): combinations that cannot run are
refused naming the field; the compression section reaches the stage (Gist alone, controller knobs);
bf16 autocast is refused where the device has none."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cloud.training.compression.stage import StageCompression
from cloud.training.features import autocast_for, compression_name
from cloud.training.jobfile import JobError, load_job
from cloud.training.options import CompressionOptions, ControllerOptions
from models.digits import digits_cnn

REPLICATED = '[partition]\nmode = "explicit"\nstages = [[0, 8]]\nreplicas = [2]\n'


def write(tmp_path, text: str):
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[train]\nschedule = "1f1b-stash"\n[sync]\nenabled = true\n',
            "sync.enabled: sync applies only to replicated stages, and schedule 1f1b-stash",
        ),
        ('[partition]\nmode = "even"\n[balance]\nenabled = true\n', "balance.enabled: .* mode even"),
        (
            '[partition]\nmode = "explicit"\nstages = [[0, 4], [5, 8]]\n[sync]\nenabled = true\n',
            "sync.enabled: .*partition.replicas has none above 1",
        ),
        (
            '[partition]\nmode = "explicit"\nstages = [[0, 4], [5, 8]]\nreplicas = [2, 2]\n'
            "[balance]\nenabled = true\n",
            "balance.enabled: balancing splits .* replicates 2 stages",
        ),
        (REPLICATED + "[balance]\nenabled = true\ndeclared_speeds = [1, 2, 3]\n", "balance.declared_speeds"),
        (REPLICATED + "[balance]\nenabled = true\ndeclared_speeds = [1, 0]\n", "balance.declared_speeds"),
        (
            '[data]\ndataset = "tensor_file"\npath = "d.pt"\nloss = "mse"\n[toggle]\nenabled = true\n',
            "toggle.enabled: .*classification loss",
        ),
        ("[toggle]\nfraction = 0\n", "toggle.fraction"),
        ('[compression]\nformat = "bfp(m=99)"\n', "compression.format"),
        (
            '[compression]\nactivations = "adaptive"\n'
            "[compression.controller]\nstart_rung = 4\ntightest_rung = 2\n",
            "compression.controller: need start_rung",
        ),
        ("[compression.controller]\nact_loosen_above = -1\n", "compression.controller.act_loosen_above"),
        ('[train]\nprecision = "fp16"\n', "train.precision"),
        ('[train]\ndevice = "tpu"\n', "train.device"),
        ("[sync]\nwindow = 0\n", "sync.window"),
    ],
)
def test_impossible_feature_combinations_name_the_field(tmp_path, text, message):
    with pytest.raises(JobError, match=message):
        load_job(write(tmp_path, text))


def test_feature_sections_load(tmp_path):
    job = load_job(
        write(
            tmp_path,
            REPLICATED + '[train]\nprecision = "bf16"\n[compression]\ngist = true\n[compression.controller]\n'
            "start_rung = 1\n[sync]\nenabled = true\nwindow = 4\n[balance]\nenabled = true\n"
            "declared_speeds = [3, 1]\n[toggle]\nenabled = true\nfraction = 0.25\n",
        )
    )
    assert (job.train.precision, job.sync.window, job.balance.declared_speeds) == ("bf16", 4, [3.0, 1.0])
    c = job.compression
    assert (c.gist, c.controller.start_rung, job.toggle.fraction) == (True, 1, 0.25)
    assert compression_name(job.compression) == "gist"
    # auto partition may or may not replicate: the job loads, the runner says whether sync ran
    assert load_job(write(tmp_path, "[sync]\nenabled = true\n")).sync.enabled


def test_gist_alone_is_lossless_and_stores_less():
    torch.manual_seed(0)
    model = digits_cnn()
    reference = digits_cnn()
    reference.load_state_dict(model.state_dict())
    stage = StageCompression(model, CompressionOptions(gist=True, min_numel=0))
    assert stage.gist_plan is not None and stage.compressor is not None and stage.controller is None
    x, y = torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,))
    context = stage.context
    assert context is not None
    with context():
        nn.functional.cross_entropy(stage.module(x), y).backward()
    nn.functional.cross_entropy(reference(x), y).backward()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        assert got.grad is not None and want.grad is not None
        assert torch.allclose(got.grad, want.grad, atol=1e-6)
    report = stage.report()
    assert 0 < report["saved_bytes_stored"] < report["saved_bytes_fp32"]
    assert set(report["formats"].values()) == {"fp32"}  # no BFP: Gist's encodings only


def test_controller_knobs_reach_the_controller():
    options = CompressionOptions(activations="adaptive", window=5, controller=ControllerOptions(start_rung=2))
    stage = StageCompression(digits_cnn(), options)
    assert stage.controller is not None
    assert (stage.controller.settings.window, stage.controller.settings.start_rung) == (5, 2)
    assert StageCompression(digits_cnn(), CompressionOptions()).compressor is None  # all off: untouched


def test_bf16_autocast_is_refused_where_the_device_has_none():
    assert autocast_for("fp32", "cpu") is None
    autocast = autocast_for("bf16", "cpu")
    assert autocast is not None
    with autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with pytest.raises(JobError, match="train.precision"):
        autocast_for("bf16", "meta")
