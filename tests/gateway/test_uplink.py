"""The uplink against a real cloudd: upload and trim, retry until stored, never drop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port, stop_process, wait_for_port
from gwtest_util import REPO, telemetry

from gateway.storage.epoch_log import EpochLog
from gateway.uplink.sender import Uplink, classify_response
from protocol.config import UplinkConfig
from protocol.records import telemetry_record

TOKEN = "s3cret-gw1"


class Cloudd:
    def __init__(self, data_dir: Path, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cloud.server",
                "--data-dir",
                str(data_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--token",
                f"gw1={TOKEN}",
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def wait(self) -> Cloudd:
        wait_for_port(self.port, timeout=30, proc=self.proc)
        return self


@pytest.fixture
def cloud_port() -> int:
    return free_port()


@pytest.fixture
def cloudd(tmp_path, cloud_port):
    server = Cloudd(tmp_path / "cloud", cloud_port).wait()
    yield server
    stop_process(server.proc)


async def until(predicate, timeout_s: float) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"condition not met within {timeout_s}s")


def config(url: str, token: str = TOKEN, **kw) -> UplinkConfig:
    return UplinkConfig(cloud_url=url, token=token, backoff_initial_s=0.05, backoff_max_s=0.2, **kw)


async def filled_log(directory: Path, n: int, record: bytes | None = None) -> EpochLog:
    log = EpochLog(directory)
    await log.open()
    for i in range(n):
        await log.append(record or telemetry_record("s1", 1000.0 + i, telemetry("s1", i)))
    await log.flush(wait=True)
    return log


async def test_batches_are_uploaded_and_the_log_trimmed(cloudd, tmp_path):
    log = await filled_log(tmp_path / "log", 25)
    uplink = Uplink(log, "gw1", config(cloudd.url, batch_max_records=10))
    await uplink.start()
    try:
        uplink.wake()
        await until(lambda: log.trimmed_lsn >= 25, 30)
        assert uplink.counters["batches_sent"] == 3
        assert uplink.counters["records_uploaded"] == 25
        assert uplink.backlog == 0
        assert [entry async for entry in log.read(1)] == []
    finally:
        await uplink.stop()
        await log.close()


async def test_wrong_token_is_an_auth_failure_and_nothing_is_trimmed(cloudd, tmp_path):
    log = await filled_log(tmp_path / "log", 3)
    uplink = Uplink(log, "gw1", config(cloudd.url, token="wrong"))
    await uplink.start()
    try:
        outcome = await uplink.send_one_batch()
        assert outcome.kind == "auth"
        assert log.trimmed_lsn == 0
    finally:
        await uplink.stop()
        await log.close()


async def test_a_batch_the_cloud_refuses_is_kept_and_reported(cloudd, tmp_path):
    log = await filled_log(tmp_path / "log", 2, record=b'{"not":"a record"}')
    uplink = Uplink(log, "gw1", config(cloudd.url))
    await uplink.start()
    try:
        outcome = await uplink.send_one_batch()
        assert outcome.kind == "rejected_by_cloud"
        assert "400" in outcome.detail
        assert log.trimmed_lsn == 0
    finally:
        await uplink.stop()
        await log.close()


async def test_uploads_wait_for_the_cloud_and_then_drain(tmp_path, cloud_port):
    log = await filled_log(tmp_path / "log", 5)
    uplink = Uplink(log, "gw1", config(f"http://127.0.0.1:{cloud_port}"))
    await uplink.start()
    server = None
    try:
        uplink.wake()
        await until(lambda: uplink.failures["connection"] >= 2, 20)
        assert log.trimmed_lsn == 0
        server = Cloudd(tmp_path / "cloud", cloud_port)
        await asyncio.to_thread(server.wait)
        await until(lambda: log.trimmed_lsn >= 5, 30)
    finally:
        await uplink.stop()
        await log.close()
        if server is not None:
            stop_process(server.proc)


def test_classify_response():
    ok = classify_response(200, '{"v":1,"stored":2,"duplicates":0,"first_lsn":1,"last_lsn":2}')
    assert ok.kind == "ok" and ok.ack is not None and ok.ack.last_lsn == 2
    assert classify_response(200, "{}").kind == "bad_ack"
    assert classify_response(401, "").kind == "auth"
    assert classify_response(403, "").kind == "auth"
    bad = classify_response(400, '{"error":"invalid","detail":"records.0.lsn: too small"}')
    assert bad.kind == "rejected_by_cloud" and "records.0.lsn" in bad.detail
    assert classify_response(503, "").kind == "server_error"
    assert classify_response(404, "nope").kind == "unexpected_status"
