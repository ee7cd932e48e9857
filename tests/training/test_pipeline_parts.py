"""Pure parts of the trainer: wire header/codec, job file validation, checkpoint completeness,
profile cache, progress reading. No process group needed."""

from __future__ import annotations

import pytest
import torch

from cloud.jobs.torchrun import read_progress, torchrun_command
from cloud.training import checkpoint, comm
from cloud.training.jobfile import JobError, load_job
from cloud.training.profiler import cached_profile, model_signature
from models.digits import digits_cnn


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(3, 4, 5),
        torch.arange(6, dtype=torch.int64).view(2, 3),
        torch.randn(7).to(torch.bfloat16),
        torch.randint(0, 255, (4, 4), dtype=torch.uint8),
    ],
)
def test_header_and_fp32_codec_round_trip(tensor):
    codec = comm.Fp32Codec()
    payload = codec.encode(tensor)
    assert payload.dtype == torch.uint8 and payload.dim() == 1
    header = comm.pack_header(codec, tensor, payload.numel())
    got_codec, dtype, shape, n_bytes = comm.unpack_header(header)
    assert got_codec.name == "fp32" and dtype == tensor.dtype and shape == tuple(tensor.shape)
    assert n_bytes == payload.numel()
    assert torch.equal(codec.decode(payload.clone(), shape, dtype), tensor)


def test_codec_registry_rejects_a_clashing_id():
    class Other:
        codec_id, name = 0, "not-fp32"

    with pytest.raises(ValueError):
        comm.register_codec(Other())
    with pytest.raises(ValueError):
        comm.codec_by_name("bfp-nope")


def test_job_file_errors_name_the_field(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("[train]\nbatch_size = 10\nmicrobatches = 4\n")
    with pytest.raises(JobError, match="train"):
        load_job(job)
    job.write_text('[train]\nschedule = "zigzag"\n')
    with pytest.raises(JobError, match="schedule"):
        load_job(job)
    job.write_text("[trian]\n")
    with pytest.raises(JobError, match="trian"):
        load_job(job)
    job.write_text('[checkpoint]\ndir = "ck"\n[progress]\nfile = "/abs/p.jsonl"\n')
    loaded = load_job(job)
    assert loaded.checkpoint.dir == str(tmp_path / "ck") and loaded.progress.file == "/abs/p.jsonl"
    assert loaded.partition.profile_cache == str(tmp_path / "ck" / "profile.json")


def test_only_steps_every_stage_wrote_are_complete(tmp_path):
    for step in (5, 10):
        checkpoint.save_stage(tmp_path, 0, step, {"step": step})
    checkpoint.save_stage(tmp_path, 1, 5, {"step": 5})
    (tmp_path / "stage1" / ".step00000010.pt.tmp").write_bytes(b"torn")  # crash mid-write: ignored
    assert checkpoint.latest_complete_step(tmp_path, 2) == 5
    assert checkpoint.load_stage(tmp_path, 1, 5) == {"step": 5}
    assert checkpoint.latest_complete_step(tmp_path / "none", 2) is None
    for step in (15, 20, 25):
        checkpoint.save_stage(tmp_path, 0, step, {}, keep=2)
    assert checkpoint.stage_steps(tmp_path, 0) == [20, 25]


def test_profile_cache_is_reused_per_signature(tmp_path):
    model, cache = digits_cnn(), tmp_path / "profile.json"
    first = cached_profile(model, torch.randn(8, 1, 8, 8), cache, threads=1, repeats=1)
    assert len(first) == len(model) and first[0].param_bytes == (16 * 9 + 16) * 4
    assert first[0].activation_bytes == 8 * 16 * 8 * 8 * 4
    again = cached_profile(model, torch.randn(8, 1, 8, 8), cache, threads=1, repeats=1)
    assert again == first  # served from the file, not re-measured
    assert model_signature(model, (8, 1, 8, 8), 1) != model_signature(model, (16, 1, 8, 8), 1)


def test_read_progress_skips_a_line_being_written(tmp_path):
    path = tmp_path / "progress.jsonl"
    assert read_progress(path) == []
    path.write_text('{"event": "start"}\n{"event": "step", "st')
    assert read_progress(path) == [{"event": "start"}]
    assert torchrun_command(path, 3)[-5:-1] == ["3", "-m", "cloud.training.run", "--job"]


@pytest.mark.parametrize("schedule_name", ["gpipe", "1f1b-stash"])
def test_one_stage_executor_equals_plain_sgd(schedule_name):
    """One stage needs no process group: flush = gradient accumulation, stash = an update per
    microbatch computed on the stashed snapshot (which, with one stage, is never stale)."""
    from torch import nn

    from cloud.training.executor import StageExecutor
    from cloud.training.schedules import build_schedule

    torch.manual_seed(0)
    ours, reference = digits_cnn(), digits_cnn()
    reference.load_state_dict(ours.state_dict())
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,))
    xs, ys = dict(enumerate(x.chunk(4))), dict(enumerate(y.chunk(4)))
    schedule = build_schedule(schedule_name, [1], 4)
    optimizer = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    executor = StageExecutor(ours, schedule.topology, 0, optimizer=optimizer, loss_fn=nn.CrossEntropyLoss())
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        stats = executor.run_step(schedule, xs, ys)
        assert stats.n_losses == 4
        for b in range(4):
            loss = nn.functional.cross_entropy(reference(xs[b]), ys[b])
            if schedule_name == "gpipe":
                (loss / 4).backward()
            else:
                loss.backward()
                reference_optimizer.step()
                reference_optimizer.zero_grad()
        if schedule_name == "gpipe":
            reference_optimizer.step()
            reference_optimizer.zero_grad()
    for name, value in reference.state_dict().items():
        assert torch.allclose(ours.state_dict()[name], value, rtol=1e-5, atol=1e-7), name


@pytest.mark.parametrize("stashed", [False, True])
def test_split_backward_equals_one_backward(stashed):
    """Input gradient first, weight gradients after: the same numbers as one autograd.grad over the
    stage, on a slice of the digits CNN (layer names that do not start at 0, parameterless layers)."""
    from torch.func import functional_call

    from cloud.training import backward

    torch.manual_seed(0)
    stage = digits_cnn()[2:]
    assert backward.splittable(stage)
    x = torch.randn(8, 16, 8, 8).requires_grad_(True)  # what layer 1 (ReLU after conv 0) passes on
    params = {name: p.detach().clone().requires_grad_(True) for name, p in stage.named_parameters()}
    if not stashed:
        params_used, weights = None, list(stage.parameters())
    else:
        params_used, weights = params, list(params.values())
    grad_out = torch.randn(8, 10)

    tape = backward.LayerTape(stage, x, params_used)
    input_grad, output_grads = backward.input_gradient(tape, tape.output, x, grad_out)
    weight_grads = backward.weight_gradients(tape, output_grads)

    out = functional_call(stage, params, (x,)) if stashed else stage(x)
    expected = torch.autograd.grad(out, [x, *weights], grad_out)
    assert torch.equal(tape.output, out)
    assert torch.allclose(input_grad, expected[0], rtol=1e-6, atol=1e-7)
    assert len(weight_grads) == len(weights)
    for got, want in zip(weight_grads, expected[1:], strict=True):
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-7)


def test_split_backward_refuses_in_place_and_shared_layers():
    from torch import nn

    from cloud.training import backward

    assert not backward.splittable(nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True)))
    shared = nn.Linear(4, 4)
    assert not backward.splittable(nn.Sequential(shared, nn.ReLU(), shared))
    assert not backward.splittable(torch.fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4))))
