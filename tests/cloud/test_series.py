"""The device series tables (cloud/store/series.py) on a real store: every tier counts each stored
reading once, whatever order and replays the batches came in, and a window read from any tier
adds up to the same messages and extremes."""

from __future__ import annotations

import json

from cloud.store import DatasetStore, series
from protocol.batch import decode_batch
from tests.harness.cloud_http import telemetry_batch

GW, LOG, DEV = "gw1", "aaaa0001", "sensor-000"


def _store(store: DatasetStore, first: int, count: int) -> None:
    body, _ = telemetry_batch(GW, LOG, DEV, first, count)
    store.store_batch(decode_batch(body))


def test_every_tier_counts_each_reading_once(tmp_path, database_url):
    store = DatasetStore.open(tmp_path, database=database_url)
    try:
        _store(store, 2001, 2000)  # later records first: batches arrive in any order
        _store(store, 1, 2000)
        _store(store, 1001, 2000)  # straddles both: every one already there
        _store(store, 1, 2000)  # all replayed
        sent = {}
        for first in (1, 2001):
            body, _ = telemetry_batch(GW, LOG, DEV, first, 2000)
            for r in json.loads(body)["records"]:
                sent[r["data"]["body"]["seq"]] = r["data"]["body"]["readings"]["temperature_c"]

        def totals(conn):
            rows = conn.execute(
                "SELECT width, sum(n), min(lo), max(hi) FROM rollups "
                "WHERE name='temperature_c' GROUP BY width"
            ).fetchall()
            messages = conn.execute("SELECT width, sum(n) FROM message_rollups GROUP BY width").fetchall()
            (samples,) = conn.execute("SELECT count(*) FROM samples").fetchone()
            return rows, dict(messages), samples

        rows, messages, samples = store.read(totals)
        assert samples == 4000
        assert [w for w, *_ in rows] == list(series.ROLLUP_WIDTHS)
        for width, n, lo, hi in rows:
            assert (n, lo, hi) == (4000, min(sent.values()), max(sent.values())), width
            assert messages[width] == 4000
        for span_points in (10, 100, 1000, 5000):  # 1 min, 10 s and 1 s rollups, then raw
            doc = store.read(lambda c, p=span_points: series.window(c, GW, DEV, 1000.0, 5001.0, p))
            points = doc["series"]["temperature_c"]
            assert sum(p[4] for p in points) == 4000, doc["width"]
            assert min(p[2] for p in points) == min(sent.values())
        counted = store.read(lambda c: series.messages(c, GW, DEV, 0.0, 10_000.0))
        assert (counted["messages"], counted["gaps"], counted["faults"]) == (4000, 0, 0)
    finally:
        store.close()
