"""Compressed pipeline training under real torchrun (gloo, CPU): BFP on the wire between stages,
compressed saved activations (adaptive formats + Gist) inside each stage, bytes and decisions in
the progress file. Also the BFP wire codecs on their own."""

from __future__ import annotations

import pytest
import torch

from cloud.training import comm
from cloud.training.compression.wire_codec import WIRE_FORMATS, register_wire_codecs
from models.numerics import BfpCodec, encode
from tests.harness.torchrun import run_job

torch.set_num_threads(1)


def test_wire_codecs_round_trip_within_bound_and_are_registered() -> None:
    register_wire_codecs()
    x = torch.randn(16, 32, 8, 8) * 3
    x[0, 0, 0, 0] = float("inf")
    for name, fmt in WIRE_FORMATS.items():
        codec = comm.codec_by_name(name)
        assert codec.codec_id != 0
        payload = codec.encode(x)
        assert payload.dtype == torch.uint8 and payload.numel() < x.numel() * 4
        y = codec.decode(payload.clone(), tuple(x.shape), x.dtype)
        assert y.shape == x.shape and y._base is None and y[0, 0, 0, 0] == float("inf")
        bound = BfpCodec(fmt).error_bound(encode(x, fmt))
        finite = torch.isfinite(x)
        assert bool(((y - x).abs().double()[finite] <= bound[finite]).all())
    with pytest.raises(ValueError):
        comm.codec_by_name("bfp4").decode(comm.codec_by_name("bfp4").encode(x), (16, 32, 64), x.dtype)


@pytest.mark.slow  # torchrun
@pytest.mark.timeout(400)
def test_compressed_digits_pipeline_under_torchrun(tmp_path) -> None:
    job = tmp_path / "job.toml"
    job.write_text("""
[train]
schedule = "1f1b-flush"
microbatches = 4
batch_size = 64
epochs = 4
lr = 0.05
seed = 0
wire_codec = "bfp8"
[partition]
mode = "explicit"
stages = [[0, 5], [6, 8]]
[compression]
activations = "adaptive"
gist = true
window = 10
min_numel = 1024
[checkpoint]
dir = "ckpt"
[progress]
file = "progress.jsonl"
log_every = 5
""")
    events = run_job(job, 2, timeout_s=360)
    assert events[-1]["event"] == "done"
    steps = [e for e in events if e["event"] == "step"]
    assert steps and all({"loss", "samples_per_s", "stages", "compression"} <= e.keys() for e in steps)
    for e in steps:
        c = e["compression"]
        assert 0 < c["saved_bytes_stored"] < c["saved_bytes_fp32"] / 2  # Gist + BFP on both stages
        assert 0 < c["wire_bytes_sent"] < c["wire_bytes_fp32"] / 3  # 8.25 of 32 bits cross the wire
        assert c["formats"] and all(f.startswith("bfp(") or f == "fp32" for f in c["formats"].values())
    last_window = steps[-1]["compression"]  # the controller started at m8 and has tightened since
    assert last_window["saved_bytes_stored"] < last_window["saved_bytes_fp32"] / 3
    decisions = [e for e in events if e["event"] == "compression_decision"]
    fields = {"stage", "step", "layer", "old", "new", "reason"}
    assert decisions and all(fields <= d.keys() for d in decisions)
    # The last formats reported are the ones the decisions led to.
    last = {d["layer"]: d["new"] for d in decisions}
    assert all(steps[-1]["compression"]["formats"].get(layer, new) == new for layer, new in last.items())
    final = [e for e in events if e["event"] == "eval"][-1]
    assert final["accuracy"] >= 0.85, final
