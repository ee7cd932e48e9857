"""Federated training on digits: accuracy against rounds and against uplink bytes, for fp32 updates,
compressed updates (BFP; top-k + BFP with error feedback) and raw-data upload (the baseline).

An in-process simulation of 10 non-IID gateways (each mostly 2 classes) with asynchronous arrivals:
each step a random gateway trains on the global version it last fetched (so updates arrive stale)
and its update joins a FedBuff buffer (K=5, staleness-weighted). It uses the real pieces: the
gateway's ``train_local`` and ``UpdateEncoder``, the record bytes the uplink would carry, the cloud's
``decode_update`` and ``FedBuff``. Raw upload = every sample sent once as a log record, then
centralised training (``train_single_process``), one epoch per "round".

Ratios: ``update_bytes_vs_fp32`` = fp32 update bytes / compressed update bytes over the same run
(payload bytes; record bytes are in the rows), ``accuracy_drop_pp`` = fp32 accuracy - compressed
accuracy in percentage points (the mean over the last 5 versions: non-IID runs oscillate).

    python -m bench.federated [--quick]   -> bench/results/federated.json
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from bench._common import Results, parse_args
from cloud.federated.decode import decode_update
from cloud.federated.layout import Layout, build_model
from cloud.federated.strategies import ClientUpdate, FedBuff
from gateway.federated.encoder import CodecSpec, UpdateEncoder
from gateway.federated.samples import sample_record
from gateway.federated.trainer import train_local
from models.digits import accuracy, load_digits_split, non_iid_split, train_single_process
from models.numerics import BfpFormat
from protocol.federated import FederatedJob, ModelArch, RoundConfig, UpdateEnvelope, pack_payload
from protocol.records import Record, encode_record

N_GATEWAYS = 10
ARCH = ModelArch(kind="digits_mlp", width=64)
ROUND = RoundConfig(lr=0.05, momentum=0.9, local_epochs=2, batch_size=16)
CODECS = {
    "fp32": CodecSpec("fp32"),
    "bfp6": CodecSpec("bfp", BfpFormat(block_size=32, mantissa_bits=6)),
    "topk10+bfp6": CodecSpec("topk_bfp", BfpFormat(block_size=32, mantissa_bits=6), topk_fraction=0.1),
}


@dataclass
class Curve:
    versions: list[int]
    accuracy: list[float]
    uplink_bytes: list[int]  # cumulative record bytes when the version appeared
    payload_bytes: int = 0
    record_bytes: int = 0
    updates: int = 0

    def tail_accuracy(self, n: int = 5) -> float:
        return sum(self.accuracy[-n:]) / len(self.accuracy[-n:])


def run_federated(split, parts: list[torch.Tensor], spec: CodecSpec, versions: int, seed: int = 0) -> Curve:
    torch.manual_seed(seed)
    model = build_model(ARCH)
    layout = Layout.of(model)
    weights = layout.flatten(model.state_dict())
    strategy = FedBuff(FederatedJob(buffer_k=5, max_staleness=20))
    encoders = [UpdateEncoder(spec) for _ in parts]
    fetched = [(0, weights.clone()) for _ in parts]
    generators = [torch.Generator().manual_seed(seed * 100 + g) for g in range(len(parts))]
    arrivals = random.Random(seed)
    curve = Curve([], [], [])
    buffer: list[ClientUpdate] = []
    version = 0
    while version < versions:
        g = arrivals.randrange(len(parts))
        base_version, base = fetched[g]
        local = build_model(ARCH)
        local.load_state_dict(layout.unflatten(base))
        result = train_local(
            local, split.train_x[parts[g]], split.train_y[parts[g]], ROUND, generator=generators[g]
        )
        entries, sections = encoders[g].encode(result.tensors, result.state_names)
        b64, sha = pack_payload(sections)
        envelope = UpdateEnvelope(
            update_id=f"u{curve.updates}",
            model="digits",
            base_version=base_version,
            samples=result.samples,
            local_steps=result.steps,
            codec=spec.describe(),
            tensors=entries,
            payload_sha256=sha,
            payload_b64=b64,
        )
        record = encode_record(
            Record(kind="update", device="trainer", received_ts=0.0, body=envelope.model_dump(mode="json"))
        )
        curve.updates += 1
        curve.payload_bytes += sum(t.nbytes for t in entries)
        curve.record_bytes += len(record)
        delta = decode_update(envelope, "digits", layout, 1 << 22)
        assert isinstance(delta, torch.Tensor), delta
        update = ClientUpdate(f"gw{g}", envelope.update_id, base_version, result.samples, delta)
        if strategy.admit(update, version, buffer) is None:
            buffer.append(update)
        fetched[g] = (version, weights.clone())  # the gateway fetches the newest model after sending
        if strategy.ready(buffer, version, 0.0):
            step = strategy.aggregate(buffer, [], version)
            assert step is not None
            weights = weights + step.step
            version += 1
            buffer = []
            model.load_state_dict(layout.unflatten(weights))
            curve.versions.append(version)
            curve.accuracy.append(accuracy(model, split.test_x, split.test_y))
            curve.uplink_bytes.append(curve.record_bytes)
    return curve


def run_raw(split, epochs: int, seed: int = 0) -> Curve:
    upload = sum(
        len(sample_record("camera", 0.0, split.train_x[i], int(split.train_y[i])))
        for i in range(len(split.train_y))
    )
    torch.manual_seed(seed)
    model = build_model(ARCH)
    curve = Curve([], [], [], payload_bytes=upload, record_bytes=upload, updates=0)
    for epoch in range(1, epochs + 1):
        train_single_process(model, split, epochs=1, seed=seed + epoch)
        curve.versions.append(epoch)
        curve.accuracy.append(accuracy(model, split.test_x, split.test_y))
        curve.uplink_bytes.append(upload)
    return curve


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    torch.set_num_threads(1)
    # quick: fewer versions (each costs buffer_k=5 local rounds per codec): under a minute on 2 busy cores
    versions, epochs = (15, 6) if args.quick else (120, 30)
    split = load_digits_split(0)
    parts = non_iid_split(split.train_y, N_GATEWAYS)
    results = Results("federated", args.quick)
    curves: dict[str, Curve] = {}
    for name, spec in CODECS.items():
        started = time.perf_counter()
        curves[name] = curve = run_federated(split, parts, spec, versions)
        for v, acc, nbytes in zip(curve.versions, curve.accuracy, curve.uplink_bytes, strict=True):
            if v % 5 == 0:
                results.add(f"v{v}", name, "accuracy", acc)
                results.add(f"v{v}", name, "uplink_record_bytes", nbytes)
        results.add("final", name, "accuracy_last5", curve.tail_accuracy())
        results.add("final", name, "payload_bytes_per_update", curve.payload_bytes / curve.updates)
        results.add("final", name, "uplink_record_bytes", curve.record_bytes)
        results.add("final", name, "seconds", time.perf_counter() - started)
    raw = run_raw(split, epochs)
    for epoch, acc in zip(raw.versions, raw.accuracy, strict=True):
        if epoch % 5 == 0:
            results.add(f"epoch{epoch}", "raw_upload", "accuracy", acc)
    results.add("final", "raw_upload", "accuracy_last5", raw.tail_accuracy())
    results.add("final", "raw_upload", "uplink_record_bytes", raw.record_bytes)
    fp32, bfp = curves["fp32"], curves["bfp6"]
    results.ratio("update_bytes_vs_fp32", fp32.payload_bytes / fp32.updates, bfp.payload_bytes / bfp.updates)
    results.ratios["accuracy_drop_pp"] = 100.0 * (fp32.tail_accuracy() - bfp.tail_accuracy())
    topk = curves["topk10+bfp6"]
    results.ratio(
        "topk_update_bytes_vs_fp32", fp32.payload_bytes / fp32.updates, topk.payload_bytes / topk.updates
    )
    results.ratios["topk_accuracy_drop_pp"] = 100.0 * (fp32.tail_accuracy() - topk.tail_accuracy())
    results.ratio("raw_bytes_vs_fp32_fleet_bytes", raw.record_bytes, fp32.record_bytes)
    results.write()


if __name__ == "__main__":
    main()
