"""CloudServer in-process (as the demo uses it): port 0, start/stop in order, store closed on stop."""

from __future__ import annotations

import aiohttp

from cloud.api.context import STORE
from cloud.config import CloudConfig
from cloud.server import CloudServer
from cloud.store import DatasetStore
from protocol.batch import idempotency_key
from tests.harness.cloud_http import batch_body


async def test_in_process_server_round_trip(tmp_path):
    config = CloudConfig(data_dir=tmp_path / "data", port=0, gateway_tokens={"gw1": "t1"})
    server = CloudServer(config)
    await server.start()
    try:
        headers = {"Authorization": "Bearer t1", "Idempotency-Key": idempotency_key("gw1", "abcdef12", 1, 2)}
        async with aiohttp.ClientSession() as session:
            url = f"{server.url}/v1/gateways/gw1/batches"
            async with session.post(url, data=batch_body("gw1", "abcdef12", [1, 2]), headers=headers) as r:
                assert r.status == 200 and (await r.json())["stored"] == 2
            async with session.get(f"{server.url}/v1/status") as r:  # no operator token configured
                assert (await r.json())["totals"] == {"records": 2, "batches": 1}
    finally:
        await server.stop()
    await server.stop()  # idempotent
    store = DatasetStore.open(tmp_path / "data")  # the lock was released: the store is closed
    assert [r.lsn for r in store.iter_records()] == [1, 2]
    store.close()


async def test_an_upload_to_a_store_with_no_room_is_refused_before_its_body_is_read(tmp_path):
    """503 ``busy`` comes before the body is decoded (a refusal under overload costs next to
    nothing: cloud/api/ingest.py), so even a body that is not JSON gets it; the status and fleet
    pages still answer (their counts are reads, not queued with the writes); the connection is kept
    and, with room again, the same session's next upload is stored."""
    config = CloudConfig(data_dir=tmp_path / "data", port=0, gateway_tokens={"gw1": "t1"})
    server = CloudServer(config)
    await server.start()
    store = server.app[STORE]
    store.max_pending = 0  # as when uploads fill its queue
    try:
        headers = {"Authorization": "Bearer t1", "Idempotency-Key": idempotency_key("gw1", "abcdef12", 1, 2)}
        async with aiohttp.ClientSession() as session:
            url = f"{server.url}/v1/gateways/gw1/batches"
            async with session.post(url, data=b"not json at all", headers=headers) as r:
                assert r.status == 503 and r.headers["Retry-After"] == "1"
                assert (await r.json())["error"] == "busy"
            for page in ("/v1/status", "/v1/fleet?limit=50&sort=records"):  # reads answer all the same
                async with session.get(f"{server.url}{page}") as r:
                    assert r.status == 200, await r.text()
            store.max_pending = 64
            async with session.post(url, data=batch_body("gw1", "abcdef12", [1, 2]), headers=headers) as r:
                assert r.status == 200 and (await r.json())["stored"] == 2
    finally:
        await server.stop()
