"""Resumable blob upload against a real cloudd: the HTTP contract, connection resets mid-upload through
the real FaultProxy (the blob arrives intact and each upload resumes at the cloud's offset instead of
starting again from 0), a SIGKILLed cloudd keeps its partial upload, and the blob's log record reaches
the cloud only with its blob."""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from gateway.storage.epoch_log import EpochLog
from gateway.uplink.blobs import BlobSpool, BlobUploader, blob_record
from gateway.uplink.drain import TokenBucket
from gateway.uplink.sender import Uplink
from protocol.config import UplinkConfig
from protocol.records import Record, encode_record
from tests.harness.faultproxy import FaultProxy
from tests.harness.poll import eventually

pytestmark = pytest.mark.timeout(120)

CHUNK = 32 * 1024


def blob_bytes(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def committed_blob(cloudd, blob_id: str) -> bytes:
    return (cloudd.data_dir / "blobs" / "gw1" / blob_id).read_bytes()


async def test_http_contract(cloudd):
    url = f"{cloudd.url}/v1/gateways/gw1/blobs/frame-1"
    data = blob_bytes(10_000)
    sha = hashlib.sha256(data).hexdigest()
    auth = {"Authorization": f"Bearer {cloudd.token_for('gw1')}"}
    async with aiohttp.ClientSession() as s:
        async with s.put(f"{url}?offset=0", data=data[:4000]) as r:
            assert r.status == 401
        async with s.put(f"{url}?offset=0", data=data[:4000], headers=auth) as r:
            assert r.status == 200 and (await r.json())["offset"] == 4000
        async with s.put(f"{url}?offset=100", data=data[100:200], headers=auth) as r:
            doc = await r.json()
            assert r.status == 409 and doc["error"] == "offset_mismatch"
            assert r.headers["Upload-Offset"] == "4000"
        async with s.head(url, headers=auth) as r:
            assert r.headers["Upload-Offset"] == "4000" and r.headers["Blob-Committed"] == "0"
        async with s.put(f"{url}?offset=4000&final=1", data=data[4000:], headers=auth) as r:
            assert r.status == 400  # final needs X-Sha256
        async with s.put(
            f"{url}?offset=4000&final=1", data=data[4000:], headers={**auth, "X-Sha256": sha}
        ) as r:
            doc = await r.json()
            assert r.status == 200 and doc["committed"] and doc["sha256"] == sha and doc["offset"] == 10_000
        async with s.put(f"{url}?offset=0&final=1", data=data, headers={**auth, "X-Sha256": sha}) as r:
            assert r.status == 200 and (await r.json())["committed"]  # idempotent replay: a no-op
        async with s.get(f"{url}/status", headers=auth) as r:
            assert (await r.json()) == {
                "v": 1,
                "blob_id": "frame-1",
                "offset": 10_000,
                "committed": True,
                "sha256": sha,
            }
        bad = f"{cloudd.url}/v1/gateways/gw1/blobs/frame-2"
        async with s.put(f"{bad}?offset=0&final=1", data=b"abc", headers={**auth, "X-Sha256": sha}) as r:
            assert r.status == 422 and (await r.json())["error"] == "sha256_mismatch"
    assert committed_blob(cloudd, "frame-1") == data
    assert metric(cloudd.url, "cloudd_blob_bytes_written_total") == 10_000 + 3  # the replay wrote nothing


async def test_resets_mid_upload_resume_at_the_clouds_offset(cloudd, tmp_path):
    """A blob referenced by a log record goes up through a proxy that resets every connection twice
    mid-upload: the blob arrives intact, each byte is written once (never restarted from 0), and
    the record reaches the cloud."""
    proxy = FaultProxy(cloudd.port)
    await proxy.start()
    await proxy.set_mode("pass", bandwidth_Bps=200_000)  # ~2.5 s for the blob: time to cut it
    data = blob_bytes(512 * 1024)
    spool = BlobSpool(tmp_path / "spool")
    ref = spool.put(data, content_type="image/jpeg")
    log = EpochLog(tmp_path / "log", segment_bytes=64 * 1024, max_bytes=64 << 20)
    await log.open()
    await log.append(encode_record(Record(kind="telemetry", device="s1", received_ts=1.0, body={"seq": 1})))
    await log.append(blob_record("cam-1", 2.0, ref, frame=7))
    await log.flush(wait=True)
    config = UplinkConfig(
        cloud_url=f"http://127.0.0.1:{proxy.port}",
        token=cloudd.token_for("gw1"),
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        timeout_s=5.0,
        blob_chunk_bytes=CHUNK,
    )
    uplink = Uplink(log, "gw1", config, blob_spool=spool)
    await uplink.start()
    try:
        assert uplink.blobs is not None
        for cut in (4, 10):  # reset every connection once this many chunks have gone
            await eventually(
                lambda cut=cut: uplink.blobs.counters["chunks_sent"] >= cut,
                30,
                f"{cut} chunks sent",
                interval_s=0.02,
            )
            await proxy.set_mode("reset")
            await asyncio.sleep(0.3)  # the scenario: the link resets every connection for 0.3 s
            await proxy.set_mode("pass", bandwidth_Bps=200_000)
        await eventually(lambda: uplink.acknowledged(2), 60, "the blob's record acknowledged")
    finally:
        await uplink.stop()
        await log.close()
        await proxy.stop()
    assert proxy.stats["resets"] >= 1
    assert committed_blob(cloudd, ref.blob_id) == data
    assert uplink.failures["connection"] + uplink.failures["timeout"] >= 2
    assert len(uplink.blobs.resumed_at) >= 2 and min(uplink.blobs.resumed_at) >= 4 * CHUNK
    # every byte written once: no upload started again from offset 0
    assert metric(cloudd.url, "cloudd_blob_bytes_written_total") == len(data)
    assert not spool.exists(ref.blob_id)  # deleted only after the cloud committed it
    # after a failure both records are backlog, where the event (the blob's record) goes first
    stored = [r.record for r in sorted(cloudd.records("gw1"), key=lambda r: r.lsn)]
    assert [r["body"].get("blob", {}).get("sha256") for r in stored] == [None, ref.sha256]


async def test_partial_upload_survives_a_cloudd_kill(cloudd, tmp_path):
    data = blob_bytes(400 * 1024, seed=2)
    spool = BlobSpool(tmp_path / "spool")
    ref = spool.put(data)
    slow = TokenBucket(150_000, 32 * 1024)  # the gateway's own bandwidth cap paces the chunks
    uploader = BlobUploader(spool, cloudd.url, "gw1", cloudd.token_for("gw1"), chunk_bytes=CHUNK, bucket=slow)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        task = asyncio.create_task(uploader.upload(session, ref))
        await eventually(lambda: uploader.counters["chunks_sent"] >= 4, 30, "4 chunks sent", interval_s=0.02)
        await asyncio.to_thread(cloudd.kill)  # SIGKILL: no shutdown of any kind
        first = await asyncio.wait_for(task, 30)
        assert first.kind in ("connection", "timeout")
        sent_before = uploader.counters["bytes_sent"]
        await asyncio.to_thread(cloudd.start)
        # a restarted gateway: a fresh uploader that knows only the spool and the record
        again = BlobUploader(spool, cloudd.url, "gw1", cloudd.token_for("gw1"), chunk_bytes=CHUNK)
        outcome = await again.upload(session, ref)
    assert outcome.kind == "ok", outcome
    assert again.resumed_at and again.resumed_at[0] >= sent_before >= 4 * CHUNK  # fsynced per chunk
    assert committed_blob(cloudd, ref.blob_id) == data
    assert metric(cloudd.url, "cloudd_blob_bytes_written_total") == len(data) - again.resumed_at[0]
    assert again.counters["bytes_sent"] == len(data) - again.resumed_at[0]


async def test_committed_blob_is_not_sent_again(cloudd, tmp_path):
    spool = BlobSpool(tmp_path / "spool")
    data = blob_bytes(70_000, seed=3)
    ref = spool.put(data)
    async with aiohttp.ClientSession() as session:
        first = BlobUploader(spool, cloudd.url, "gw1", cloudd.token_for("gw1"), chunk_bytes=CHUNK)
        assert (await first.upload(session, ref)).kind == "ok"
        assert first.counters["blobs_committed"] == 1 and not spool.exists(ref.blob_id)
        spool.put(data)  # the same frame spooled again (a gateway that crashed before deleting it)
        second = BlobUploader(spool, cloudd.url, "gw1", cloudd.token_for("gw1"), chunk_bytes=CHUNK)
        assert (await second.upload(session, ref)).kind == "ok"
    assert second.counters["blobs_already_committed"] == 1 and second.counters["bytes_sent"] == 0
    assert not spool.exists(ref.blob_id)
    assert metric(cloudd.url, "cloudd_blob_bytes_written_total") == len(data)


async def test_small_blobs_go_up_without_asking_and_resume_where_the_cloud_is(cloudd, tmp_path):
    """A blob that fits in one chunk is one PUT, not GET-then-PUT (a round trip less per camera frame
    on a slow link); several go up at once. One the cloud already holds part of is answered 409 with
    its offset, and the uploader resumes there: each byte is written once."""
    spool = BlobSpool(tmp_path / "spool")
    frames = [blob_bytes(20_000, seed=10 + i) for i in range(6)]
    refs = [spool.put(data) for data in frames]
    partial = frames[0][:8_000]  # a gateway that died mid-upload left this much in the cloud
    url = f"{cloudd.url}/v1/gateways/gw1/blobs/{refs[0].blob_id}?offset=0"
    auth = {"Authorization": f"Bearer {cloudd.token_for('gw1')}"}
    async with aiohttp.ClientSession() as session:
        async with session.put(url, data=partial, headers=auth) as response:
            assert response.status == 200
        uploader = BlobUploader(spool, cloudd.url, "gw1", cloudd.token_for("gw1"), chunk_bytes=CHUNK)
        assert (await uploader.upload_all(session, refs)).kind == "ok"
    assert uploader.counters["unasked_puts"] == len(refs) and uploader.counters["offset_resyncs"] == 1
    assert uploader.counters["blobs_committed"] == len(refs) and spool.pending() == 0
    assert [committed_blob(cloudd, ref.blob_id) for ref in refs] == frames
    assert metric(cloudd.url, "cloudd_blob_bytes_written_total") == sum(map(len, frames))


def test_blob_ids_default_to_content_hash(tmp_path: Path):
    spool = BlobSpool(tmp_path)
    a, b = spool.put(b"frame"), spool.put(b"frame")
    assert a == b and a.blob_id == hashlib.sha256(b"frame").hexdigest()[:40] and spool.pending() == 1


class Uploads:
    """What the link monitor is told of blob uploads: (bytes, ok) each."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool]] = []

    def observe_upload(self, nbytes: int, seconds: float, ok: bool) -> None:
        self.seen.append((nbytes, ok))


async def test_an_abandoned_upload_is_not_reported_as_a_link_failure(cloudd, tmp_path):
    """The uplink cancels a batch's blob uploads when it abandons the batch: that is its own doing,
    not the link's, and a dozen failures at once would call a working link down."""
    spool = BlobSpool(tmp_path / "spool")
    ref = spool.put(blob_bytes(200 * 1024, seed=3))
    proxy = FaultProxy(cloudd.port)
    port = await proxy.start()
    uploads = Uploads()
    uploader = BlobUploader(
        spool, f"http://127.0.0.1:{port}", "gw1", cloudd.token_for("gw1"), monitor=uploads
    )
    try:
        await proxy.set_mode("blackhole")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            task = asyncio.create_task(uploader.upload_all(session, [ref]))
            await asyncio.sleep(0.5)  # the PUT is on its way into the black hole
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    finally:
        await proxy.stop()
    assert uploads.seen == []
