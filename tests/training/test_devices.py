"""One code path on every device: the device/backend table, and the codecs, the Gist encodings and
the checkpoints on each device this machine has (the CUDA cases are skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cloud.training import checkpoint, comm
from cloud.training.compression import gist_transform
from cloud.training.compression.sparse import decode_sparse, encode_sparse
from cloud.training.compression.wire_codec import WIRE_FORMATS, register_wire_codecs
from cloud.training.device import DeviceUnavailable, Placement, placement_for, resolve
from models.digits import digits_cnn
from models.numerics import BfpCodec, encode, pack_for_wire, unpack_from_wire

torch.set_num_threads(1)
HAS_CUDA = torch.cuda.is_available()
NO_CUDA = "no CUDA device on this machine (bench/gpu_check.sh runs these where there is one)"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA))]
CPU, GLOO, NCCL = torch.device("cpu"), "gloo", "nccl"


@pytest.mark.parametrize(
    ("choice", "local_rank", "local_world", "gpus", "nccl", "want"),
    [
        ("cpu", 0, 2, 0, True, Placement(CPU, GLOO)),
        ("cpu", 1, 2, 2, True, Placement(CPU, GLOO)),  # asked for the CPU: GPUs or not
        ("auto", 1, 2, 0, True, Placement(CPU, GLOO)),
        ("auto", 1, 2, 2, True, Placement(torch.device("cuda", 1), NCCL)),  # a GPU per rank
        ("cuda", 0, 1, 1, True, Placement(torch.device("cuda", 0), NCCL)),
        ("cuda", 1, 2, 1, True, Placement(torch.device("cuda", 0), GLOO)),  # two ranks share a GPU
        ("auto", 3, 4, 2, True, Placement(torch.device("cuda", 1), GLOO)),
        ("cuda", 1, 2, 2, False, Placement(torch.device("cuda", 1), GLOO)),  # torch without NCCL
    ],
)
def test_device_and_backend_by_choice_rank_and_gpus(choice, local_rank, local_world, gpus, nccl, want):
    got = resolve(choice, local_rank=local_rank, local_world=local_world, gpus=gpus, nccl=nccl)
    assert got == want


@pytest.mark.parametrize(
    ("cuda_build", "why"), [(False, "this torch build has no CUDA"), (True, "torch sees no CUDA device")]
)
def test_cuda_without_a_gpu_is_refused_naming_the_field(cuda_build, why):
    with pytest.raises(DeviceUnavailable) as refused:
        resolve("cuda", local_rank=0, local_world=1, gpus=0, cuda_build=cuda_build)
    message = str(refused.value)
    assert message.startswith('train.device: "cuda"') and why in message and "\n" not in message


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU: the CPU-only answers do not apply")
def test_this_machine_without_cuda_runs_auto_on_cpu_and_refuses_cuda(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert placement_for("auto") == Placement(CPU, GLOO)
    with pytest.raises(DeviceUnavailable, match="train.device"):
        placement_for("cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_wire_codecs_encode_and_decode_on_the_tensors_device(device):
    """The payload stays on the device (NCCL sends it from there) and holds the bytes a CPU encode
    makes; the decoded tensor is on the device and within the format's bound."""
    register_wire_codecs()
    x = torch.randn(8, 16, 6, 6, generator=torch.Generator().manual_seed(0)) * 3
    x[0, 0, 0, 0] = float("inf")
    on_device = x.to(device)
    for name, fmt in WIRE_FORMATS.items():
        codec = comm.codec_by_name(name)
        payload = codec.encode(on_device)
        assert payload.device.type == device and payload.dtype == torch.uint8
        assert torch.equal(payload.cpu(), codec.encode(x))
        y = codec.decode(payload, tuple(x.shape), x.dtype)
        assert y.device.type == device and y[0, 0, 0, 0] == float("inf")
        bound = BfpCodec(fmt).error_bound(encode(x, fmt))
        finite = torch.isfinite(x)
        assert bool(((y.cpu() - x).abs().double()[finite] <= bound[finite]).all())
    fp32 = comm.Fp32Codec()
    exact = fp32.decode(fp32.encode(on_device), tuple(x.shape), x.dtype)
    assert exact.device.type == device and torch.equal(exact.cpu(), x)


@pytest.mark.parametrize("device", DEVICES)
def test_packed_wire_form_stays_on_the_device(device):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1)).to(device)
    x[7] = float("nan")  # a side entry: every section of the wire form is non-empty
    fmt = WIRE_FORMATS["bfp6"]
    wire = pack_for_wire(BfpCodec(fmt).encode(x))
    assert wire.device.type == device
    packed = unpack_from_wire(wire)
    assert {t.device.type for t in (packed.mantissas, packed.exponents, packed.side_index)} == {device}
    assert torch.equal(
        BfpCodec(fmt).decode(packed).cpu().nan_to_num(),
        BfpCodec(fmt).decode(BfpCodec(fmt).encode(x.cpu())).nan_to_num(),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_gist_encodings_give_the_plain_gradients_on_the_device(device):
    """Binarized ReLU->MaxPool and sparse ReLU->conv on the device: the gradients of the plain model
    there (Gist is lossless), and the sparse form decodes bit for bit."""
    torch.manual_seed(0)
    plain = digits_cnn().to(device)
    transformed, _ = gist_transform(digits_cnn().to(device))
    transformed.load_state_dict(plain.state_dict())
    x = torch.randn(16, 1, 8, 8).to(device)
    y = torch.randint(0, 10, (16,)).to(device)
    grads = []
    for model in (plain, transformed):
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    relu = torch.relu(torch.randn(4, 8, 6, 6)).to(device)
    sparse = encode_sparse(relu)
    assert sparse.values.device.type == device
    assert torch.equal(decode_sparse(sparse), relu)


def _trained(device: str) -> tuple[nn.Sequential, torch.optim.Optimizer]:
    """The digits CNN after two momentum SGD steps on ``device`` (momentum buffers in its state)."""
    torch.manual_seed(0)
    model = digits_cnn().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(2)
    for _ in range(2):
        x = torch.randn(8, 1, 8, 8, generator=generator).to(device)
        y = torch.randint(0, 10, (8,), generator=generator).to(device)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model, optimizer


@pytest.mark.parametrize("reader", DEVICES)
@pytest.mark.parametrize("writer", DEVICES)
def test_checkpoint_written_on_one_device_resumes_on_another(tmp_path, writer, reader):
    model, optimizer = _trained(writer)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    checkpoint.save_stage(tmp_path, 0, 2, state)
    loaded = checkpoint.load_stage(tmp_path, 0, 2)
    tensors = list(loaded["model"].values()) + [
        v for s in loaded["optimizer"]["state"].values() for v in s.values() if isinstance(v, torch.Tensor)
    ]
    assert tensors and all(t.device.type == "cpu" for t in tensors)  # the file holds CPU tensors
    resumed = digits_cnn().to(reader)
    resumed.load_state_dict(loaded["model"])
    resumed_optimizer = torch.optim.SGD(resumed.parameters(), lr=0.05, momentum=0.9)
    resumed_optimizer.load_state_dict(loaded["optimizer"])
    for p in resumed.parameters():  # weights and momentum on the reader's device, values unchanged
        assert p.device.type == reader and resumed_optimizer.state[p]["momentum_buffer"].device.type == reader
    for (name, want), got in zip(model.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(want.cpu(), got.cpu()), name
