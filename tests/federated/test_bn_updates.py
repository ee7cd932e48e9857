"""BatchNorm models trained federated: running statistics travel as exact fp32 values (never through
top-k or error feedback), a negative running variance is refused and counted, and top-k + BFP
updates reach fp32 updates' accuracy. The codec path is the real one (the gateway's trainer and
encoder, the cloud's decoder, aggregator and update rule); the last test runs it through a real
cloudd and a model architecture the cloud used not to know."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from cloud.federated.aggregate import apply_delta
from cloud.federated.decode import Refused, decode_update
from cloud.federated.layout import Layout
from cloud.federated.strategies import ClientUpdate, FedAvg
from gateway.federated.client import load_weights
from gateway.federated.encoder import CodecSpec, UpdateEncoder
from gateway.federated.trainer import LocalResult, train_local
from models.architectures import (
    BUILTIN_ARCHITECTURES,
    build_architecture,
    input_shape,
    load_floating_state,
    state_names,
)
from models.digits import accuracy, load_digits_split, non_iid_split
from protocol.federated import (
    BUILTIN_ARCHS,
    FederatedJob,
    ModelArch,
    RoundConfig,
    UpdateEnvelope,
    pack_payload,
    parse_global_model,
)
from tests.federated.test_fleet import fed_status, http, post_batch, update_record
from tests.harness.cloudd import start_cloudd
from tests.harness.poll import eventually

ARCH = ModelArch(kind="digits_bn_cnn", width=8)
FACTORY = ModelArch(kind="models.digits:digits_mlp", input_shape=[1, 8, 8])
ROUND = RoundConfig(lr=0.05, momentum=0.9, local_epochs=1, batch_size=32)
TOPK_BFP = CodecSpec("topk_bfp", topk_fraction=0.1)


def envelope(result: LocalResult, encoder: UpdateEncoder, version: int = 0) -> UpdateEnvelope:
    entries, sections = encoder.encode(result.tensors, result.state_names)
    b64, sha = pack_payload(sections)
    return UpdateEnvelope(
        update_id=f"v{version}-u",
        model="digits",
        base_version=version,
        samples=result.samples,
        local_steps=result.steps,
        codec=encoder.spec.describe(),
        tensors=entries,
        payload_sha256=sha,
        payload_b64=b64,
    )


def one_round(model: torch.nn.Module, seed: int = 0) -> LocalResult:
    split = load_digits_split(0)
    return train_local(
        model, split.train_x[:256], split.train_y[:256], ROUND, generator=torch.Generator().manual_seed(seed)
    )


def test_every_builtin_architecture_and_a_factory_build() -> None:
    assert set(BUILTIN_ARCHITECTURES) == set(BUILTIN_ARCHS)  # protocol's copy (no torch there)
    for arch in [ModelArch(kind=kind) for kind in BUILTIN_ARCHS] + [FACTORY]:
        model = build_architecture(arch).eval()
        with torch.no_grad():
            logits = model(torch.zeros(2, *input_shape(arch)))
        assert logits.dim() == 2 and logits.shape[0] == 2, arch  # a classifier's (batch, classes)
    with pytest.raises(ValueError, match="arch.kind"):
        build_architecture(ModelArch(kind="models.digits:no_such_factory", input_shape=[4]))
    with pytest.raises(ValidationError, match="input_shape"):
        ModelArch(kind="models.digits:digits_mlp")
    with pytest.raises(ValidationError, match="neither a built-in"):
        ModelArch(kind="os.system")


def test_buffers_travel_bit_exact_outside_topk_and_error_feedback() -> None:
    torch.manual_seed(0)
    model = build_architecture(ARCH)
    layout = Layout.of(model)
    assert layout.state_names == state_names(model) and len(layout.state_names) == 4
    assert layout.variance_names == {"1.running_var", "4.running_var"}
    result = one_round(model)
    encoder = UpdateEncoder(TOPK_BFP)
    update = envelope(result, encoder)
    assert {t.name for t in update.tensors if t.encoding == "state_fp32"} == layout.state_names
    flat = decode_update(update, "digits", layout, 1 << 22)
    assert isinstance(flat, torch.Tensor)
    decoded = layout.unflatten(flat)
    trained = model.state_dict()
    for name in layout.state_names:
        assert torch.equal(decoded[name], trained[name]), name  # the values, bit for bit
    assert not set(encoder.residual) & layout.state_names  # no error feedback on buffers
    assert set(encoder.residual) == set(layout.names) - layout.state_names


def test_negative_running_variance_and_misencoded_buffers_are_refused() -> None:
    torch.manual_seed(0)
    model = build_architecture(ARCH)
    layout = Layout.of(model)
    result = one_round(model)
    bad = dict(result.tensors)
    bad["4.running_var"] = bad["4.running_var"].clone()
    bad["4.running_var"][3] = -0.25
    refused = decode_update(
        envelope(dataclasses.replace(result, tensors=bad), UpdateEncoder(TOPK_BFP)), "digits", layout, 1 << 22
    )
    assert isinstance(refused, Refused) and refused.reason == "negative_variance"
    assert "4.running_var[3]" in refused.detail
    # A buffer sent as a delta (an older gateway's way) does not fit its layout entry.
    as_delta = dataclasses.replace(result, state_names=frozenset())
    refused = decode_update(envelope(as_delta, UpdateEncoder(TOPK_BFP)), "digits", layout, 1 << 22)
    assert (
        isinstance(refused, Refused) and refused.reason == "bad_tensor" and "running_mean" in refused.detail
    )


def federated_accuracy(spec: CodecSpec, rounds: int, *, buffers_as_deltas: bool = False) -> list[float]:
    """Test accuracy after each of ``rounds`` FedAvg rounds of four non-IID digits gateways.
    ``buffers_as_deltas``: the old way (running statistics through the codec like weights)."""
    split = load_digits_split(0)
    parts = non_iid_split(split.train_y, 4, seed=0)
    torch.manual_seed(0)
    model = build_architecture(ARCH)
    layout = Layout.of(model)
    if buffers_as_deltas:
        layout = dataclasses.replace(layout, state_names=frozenset(), variance_names=frozenset())
    weights, mask = layout.flatten(model.state_dict()), layout.state_mask
    encoders = [UpdateEncoder(spec) for _ in parts]
    generators = [torch.Generator().manual_seed(g) for g in range(len(parts))]
    aggregator = FedAvg(FederatedJob(aggregator="fedavg", min_updates=len(parts)))
    history = []
    for version in range(rounds):
        updates = []
        for g, index in enumerate(parts):
            local = build_architecture(ARCH)
            load_floating_state(local, layout.unflatten(weights))
            result = train_local(
                local, split.train_x[index], split.train_y[index], ROUND, generator=generators[g]
            )
            if buffers_as_deltas:
                result = dataclasses.replace(result, state_names=frozenset())
            flat = decode_update(envelope(result, encoders[g], version), "digits", layout, 1 << 22)
            assert isinstance(flat, torch.Tensor), flat
            updates.append(ClientUpdate(f"gw{g}", f"v{version}", version, result.samples, flat))
        step = aggregator.aggregate(updates, [], version, mask)
        assert step is not None
        weights = apply_delta(weights, step.step, 1.0, mask)
        global_model = build_architecture(ARCH)
        load_floating_state(global_model, layout.unflatten(weights))
        history.append(accuracy(global_model, split.test_x, split.test_y))
    return history


def test_batchnorm_model_with_topk_bfp_updates_reaches_fp32_accuracy() -> None:
    torch.set_num_threads(1)
    rounds = 20
    fp32 = federated_accuracy(CodecSpec("fp32"), rounds)
    compressed = federated_accuracy(TOPK_BFP, rounds)
    final_fp32, final_compressed = sum(fp32[-3:]) / 3, sum(compressed[-3:]) / 3  # the last rounds, averaged
    assert final_fp32 > 0.9, fp32
    assert final_compressed >= final_fp32 - 0.02, (fp32, compressed)
    # The old way, running statistics through top-k and error feedback, collapses (issue 23).
    old = federated_accuracy(TOPK_BFP, rounds, buffers_as_deltas=True)
    assert sum(old[-3:]) / 3 < final_fp32 - 0.3, old


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_cloudd_trains_a_batchnorm_architecture_and_counts_a_negative_variance(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    cloudd = start_cloudd(tmp_path / "cloud", gateways=("gw0",))
    try:
        missing = FederatedJob(arch=ModelArch(kind="no_such.module:factory", input_shape=[4]))
        status, body = http(cloudd, "PUT", "/v1/federated/job", missing.model_dump_json().encode())
        assert status == 400 and b"arch.kind" in body, body
        job = FederatedJob(model="digits", arch=ARCH, buffer_k=1, onnx_every=1, poll_interval_s=0.2)
        status, body = http(cloudd, "PUT", "/v1/federated/job", job.model_dump_json().encode())
        assert status == 201, body
        status, body = http(cloudd, "GET", "/v1/federated/gateways/gw0/model", token=cloudd.token_for("gw0"))
        assert status == 200, body
        document = parse_global_model(body)
        assert document.arch == ARCH
        model = build_architecture(document.arch)
        load_floating_state(model, load_weights(document))
        result = one_round(model)
        good = envelope(result, UpdateEncoder(TOPK_BFP))
        bad_tensors = dict(result.tensors)
        bad_tensors["1.running_var"] = -bad_tensors["1.running_var"]
        bad = envelope(dataclasses.replace(result, tensors=bad_tensors), UpdateEncoder(TOPK_BFP))
        records = [
            update_record(f"u{i}", base64.b64decode(update.payload_b64), 0, list(update.tensors))
            for i, update in enumerate((bad, good))
        ]
        await post_batch(cloudd, "gw0", "0b0b0b0b", list(enumerate(records, start=1)))

        async def settled() -> dict | None:
            state = await asyncio.to_thread(fed_status, cloudd)
            done = state["version"] == 1 and state["onnx"]["exported"] + state["onnx"]["failed"] >= 2
            return state if done else None

        state: dict | None = await eventually(settled, 60, "version 1 and both ONNX exports")
        assert state is not None
        assert state["updates"]["refused"] == {"negative_variance": 1}, state["updates"]
        assert state["onnx"] == {"exported": 2, "failed": 0}
        status, body = http(cloudd, "GET", "/v1/federated/gateways/gw0/model", token=cloudd.token_for("gw0"))
        weights = load_weights(parse_global_model(body))
        trained = model.state_dict()
        for name in state_names(model):  # one update, weight 1: the global buffers are its values
            assert torch.equal(weights[name], trained[name]), name
    finally:
        cloudd.stop()
