"""CloudServer in-process (as the demo uses it): port 0, start/stop in order, store closed on stop."""

from __future__ import annotations

import aiohttp

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
