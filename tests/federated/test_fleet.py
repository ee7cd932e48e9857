"""Ten in-process gateways (each its own EpochLogs, local trainer and real Uplink) against a real
cloudd: non-IID digits, gateways dropping out and coming back (one with its link down while it
keeps training, one restarted from its logs on disk), FedBuff aggregation. The global model reaches
within 2 points of centralised training on the same data; no update is applied twice (a resent
batch and a re-logged update change nothing); a malformed and an oversized update are refused and
counted."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import random
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import torch

from cloud.federated.layout import build_model
from gateway.federated.client import FederatedClient, load_weights
from gateway.federated.encoder import CodecSpec
from gateway.federated.samples import sample_record
from gateway.federated.trainer import LocalTrainer
from gateway.storage.epoch_log import EpochLog
from gateway.uplink.sender import Uplink
from models.digits import accuracy, load_digits_split, non_iid_split, train_single_process
from protocol.batch import encode_batch, idempotency_key
from protocol.config import UplinkConfig
from protocol.federated import FederatedJob, ModelArch, RoundConfig, TensorEntry, parse_global_model
from protocol.records import Record, encode_record
from tests.harness.cloudd import Cloudd, start_cloudd
from tests.harness.poll import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # ten gateways train to a target accuracy

N_GATEWAYS = 10
GATEWAYS = tuple(f"gw{i}" for i in range(N_GATEWAYS))
ARCH = ModelArch(kind="digits_mlp", width=64)
MAX_UPDATE_BYTES = 256 * 1024
DEADLINE_S = 150.0


def http(
    cloudd: Cloudd,
    method: str,
    path: str,
    body: bytes | None = None,
    token: str | None = None,
    headers: dict | None = None,
) -> tuple[int, bytes]:
    request = urllib.request.Request(cloudd.url + path, data=body, method=method, headers=headers or {})
    request.add_header("Authorization", f"Bearer {token or cloudd.operator_token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def fed_status(cloudd: Cloudd) -> dict:
    status, body = http(cloudd, "GET", "/v1/federated/status")
    assert status == 200, body
    return json.loads(body)


class SimGateway:
    """One gateway in this process: a private data log, an uplink log, the uplink and the client."""

    def __init__(self, name: str, base: Path, cloudd: Cloudd) -> None:
        self.name, self.base, self.cloudd = name, base, cloudd
        self.data_log: EpochLog | None = None
        self.uplink_log: EpochLog | None = None
        self.uplink: Uplink | None = None
        self.client: FederatedClient | None = None
        self.trainer = LocalTrainer(threads=1, duty=1.0, seed=int(name[2:]))

    async def open_logs(self) -> None:
        sizes = {"segment_bytes": 1 << 20, "max_bytes": 16 << 20, "writer_threads": 1}
        self.data_log = EpochLog(self.base / "data", **sizes)
        self.uplink_log = EpochLog(self.base / "log", **sizes)
        await self.data_log.open()
        await self.uplink_log.open()

    async def start_uplink(self) -> None:
        config = UplinkConfig(
            cloud_url=self.cloudd.url,
            token=self.cloudd.token_for(self.name),
            backoff_initial_s=0.1,
            backoff_max_s=1.0,
        )
        self.uplink = Uplink(self.uplink_log, self.name, config, rng=random.Random(1))
        await self.uplink.start()

    async def stop_uplink(self) -> None:
        if self.uplink is not None:
            await self.uplink.stop()
            self.uplink = None

    async def start_client(self) -> None:
        self.client = FederatedClient(
            self.name,
            self.cloudd.url,
            self.cloudd.token_for(self.name),
            self.data_log,
            self.uplink_log,
            trainer=self.trainer,
            codec=CodecSpec("bfp"),
            device="trainer",
            wake_uplink=lambda: self.uplink.wake() if self.uplink is not None else None,
            poll_interval_s=0.3,
            retrain_after_s=4.0,
            rng=random.Random(hash(self.name)),
        )
        await self.client.start()

    async def stop_client(self) -> None:
        if self.client is not None:
            await self.client.stop()
            self.client = None

    async def stop_all(self) -> None:
        await self.stop_client()
        await self.stop_uplink()
        for log in (self.data_log, self.uplink_log):
            if log is not None:
                await log.close()
        self.data_log = self.uplink_log = None


def global_accuracy(cloudd: Cloudd, split) -> tuple[int, float]:
    status, body = http(cloudd, "GET", "/v1/federated/gateways/gw0/model", token=cloudd.token_for("gw0"))
    assert status == 200, body
    document = parse_global_model(body)
    model = build_model(document.arch)
    model.load_state_dict(load_weights(document))
    return document.version, accuracy(model, split.test_x, split.test_y)


async def post_batch(cloudd: Cloudd, gateway: str, log_id: str, entries: list[tuple[int, bytes]]) -> dict:
    body = encode_batch(gateway, log_id, entries)
    headers = {
        "Authorization": f"Bearer {cloudd.token_for(gateway)}",
        "Content-Type": "application/json",
        "Idempotency-Key": idempotency_key(gateway, log_id, entries[0][0], entries[-1][0]),
    }
    url = f"{cloudd.url}/v1/gateways/{gateway}/batches"
    async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        return await response.json()


def status_of(cloudd: Cloudd):
    """A probe for ``eventually``: the federated status, fetched off the event loop."""
    return lambda: asyncio.to_thread(fed_status, cloudd)


def update_record(update_id: str, payload: bytes, version: int, tensors: list[TensorEntry]) -> bytes:
    body = {
        "v": 1,
        "update_id": update_id,
        "model": "digits",
        "base_version": version,
        "samples": 10,
        "local_steps": 1,
        "codec": "fp32",
        "tensors": [t.model_dump() for t in tensors],
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "payload_b64": base64.b64encode(payload).decode(),
    }
    return encode_record(Record(kind="update", device="trainer", received_ts=time.time(), body=body))


async def test_ten_gateways_reach_centralised_accuracy(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    split = load_digits_split(0)
    torch.manual_seed(0)
    central = build_model(ARCH)
    train_single_process(central, split)
    central_acc = accuracy(central, split.test_x, split.test_y)

    cloudd = start_cloudd(tmp_path / "cloud", gateways=GATEWAYS)
    gateways = [SimGateway(name, tmp_path / name, cloudd) for name in GATEWAYS]
    try:
        job = FederatedJob(
            model="digits",
            arch=ARCH,
            aggregator="fedbuff",
            buffer_k=5,
            max_staleness=20,
            round=RoundConfig(lr=0.05, momentum=0.9, local_epochs=2, batch_size=16),
            max_update_bytes=MAX_UPDATE_BYTES,
            onnx_every=25,
            poll_interval_s=0.2,
        )
        status, body = http(
            cloudd,
            "PUT",
            "/v1/federated/job",
            job.model_dump_json().encode(),
            headers={"Content-Type": "application/json"},
        )
        assert status == 201, body
        assert http(cloudd, "PUT", "/v1/federated/job", job.model_dump_json().encode())[0] == 200

        for gateway, part in zip(gateways, non_iid_split(split.train_y, N_GATEWAYS), strict=True):
            await gateway.open_logs()
            for i in part.tolist():
                sample = sample_record("camera", float(i), split.train_x[i], int(split.train_y[i]))
                await gateway.data_log.append(sample)
            await gateway.data_log.flush(wait=True)
            await gateway.start_uplink()
            await gateway.start_client()

        # Dropouts: gw3 loses its link but keeps training (its updates wait in its log); gw7 goes away
        # entirely (its process "dies": logs closed) and comes back from its files.
        await eventually(status_of(cloudd), 60, "version 5", check=lambda s: s["version"] >= 5)
        await gateways[3].stop_uplink()
        await gateways[7].stop_all()
        await eventually(
            status_of(cloudd), 60, "version 12 without gw3 and gw7", check=lambda s: s["version"] >= 12
        )
        await gateways[3].start_uplink()
        await gateways[7].open_logs()
        await gateways[7].start_uplink()
        await gateways[7].start_client()

        def progress() -> dict:
            version, acc = global_accuracy(cloudd, split)
            back = {p["gateway"]: p for p in fed_status(cloudd)["participants"]}
            rejoined = {g: back.get(g, {}).get("last_applied_version") for g in ("gw3", "gw7")}
            return {"version": version, "accuracy": acc, "central": central_acc, "rejoined": rejoined}

        await eventually(
            lambda: asyncio.to_thread(progress),
            DEADLINE_S,
            "the global model within 2 points of centralised training, with updates of gw3 and gw7 "
            "applied after version 12",
            check=lambda p: (
                p["accuracy"] >= central_acc - 0.02 and all((v or 0) > 12 for v in p["rejoined"].values())
            ),
            interval_s=1.0,
        )

        for gateway in gateways:
            await gateway.stop_client()
        # quiet: every update in the gateways' logs stored by cloudd and read by its coordinator (an
        # update read later could still fill FedBuff's buffer and be applied under the checks below)
        await eventually(
            lambda: all(g.uplink is None or g.uplink.backlog == 0 for g in gateways),
            30,
            "every uplink log delivered (backlog 0)",
        )
        stored_updates = sum(r.record["kind"] == "update" for r in cloudd.records())
        status = await eventually(
            status_of(cloudd),
            30,
            f"the coordinator to have read all {stored_updates} stored updates",
            check=lambda s: s["updates"]["received"] == stored_updates,
        )
        assert status["staleness"]["max"] >= 1  # asynchronous: some updates were applied late
        assert sum(h["updates"] for h in status["history"]) <= status["updates"]["applied"]
        assert status["updates"]["applied"] == sum(p["applied"] for p in status["participants"])

        # No update applied twice: resend a stored update batch as is (the store dedupes it), then
        # under a fresh log_id (stored again: the aggregator's (gateway, update_id) check refuses it).
        stored = [r for r in cloudd.records("gw1") if r.record["kind"] == "update"]
        last = stored[-1]
        data = json.dumps(last.record, separators=(",", ":")).encode()
        before = fed_status(cloudd)
        ack = await post_batch(cloudd, "gw1", last.log_id, [(last.lsn, data)])
        assert ack["duplicates"] == 1 and ack["stored"] == 0
        ack = await post_batch(cloudd, "gw1", "feedface" * 4, [(1, data)])
        assert ack["stored"] == 1
        after = await eventually(
            status_of(cloudd),
            20,
            "the re-logged update counted as duplicate",
            check=lambda s: s["updates"]["duplicates"] > before["updates"]["duplicates"],
        )
        assert after["updates"]["applied"] == before["updates"]["applied"]

        # A malformed update (bad digest) and an oversized one are refused and counted.
        model = build_model(ARCH)
        tensors = [
            TensorEntry(name=k, shape=list(v.shape), encoding="fp32", nbytes=4 * v.numel())
            for k, v in model.state_dict().items()
        ]
        good_payload = b"".join(v.numpy().tobytes() for v in model.state_dict().values())
        malformed = json.loads(update_record("bad-digest", good_payload, after["version"], tensors))
        malformed["body"]["payload_sha256"] = "0" * 64
        big = b"\0" * (MAX_UPDATE_BYTES + 4096)
        oversized = update_record(
            "too-big",
            big,
            after["version"],
            [TensorEntry(name="0.weight", shape=[len(big) // 4], encoding="fp32", nbytes=len(big))],
        )
        await post_batch(
            cloudd,
            "gw2",
            "c0ffee00" * 4,
            [(1, json.dumps(malformed, separators=(",", ":")).encode()), (2, oversized)],
        )
        final = await eventually(
            status_of(cloudd),
            20,
            "both refusals counted",
            check=lambda s: (
                s["updates"]["refused"].get("too_large", 0) >= 1
                and s["updates"]["refused"].get("digest_mismatch", 0) >= 1
            ),
        )
        assert final["updates"]["applied"] == before["updates"]["applied"]
        assert final["bytes"]["payload"] > 0 and final["rounds"] == final["version"] >= 12
        assert final["onnx"]["exported"] >= 1
        # federated rounds: their own track, hidden from the default listing, each evaluated
        assert json.loads(http(cloudd, "GET", "/v1/models?name=digits")[1])["models"] == []
        listed = json.loads(http(cloudd, "GET", "/v1/models?name=digits&track=federated")[1])["models"]
        assert any(e["version"] == "0" for e in listed)
        assert all(e["track"] == "federated" and e["stage"] == "candidate" for e in listed)
        first = next(e for e in listed if e["version"] == "0")["evaluation"]
        assert first["metric"] == "accuracy" and first["rows"] > 0 and first["dataset"].startswith("digits")
        assert first["promotable"] is False  # version 0 is the untrained initial model
    finally:
        for gateway in gateways:
            await gateway.stop_all()
            gateway.trainer.close()
        cloudd.stop()
