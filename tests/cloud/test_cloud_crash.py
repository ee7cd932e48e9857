"""cloudd killed with SIGKILL while gateways upload: after a restart every acknowledged record is
there, none twice, and the gateways' retries complete the dataset exactly once."""

from __future__ import annotations

import threading
from collections import Counter

from tests.harness.cloud_http import upload

LOG = "feedface01"
BATCH = 25


def uploader(
    cloudd,
    gateway: str,
    sent: list[list[int]],
    acked: list[list[int]],
    enough: threading.Event,
    stop: threading.Event,
) -> None:
    """Upload consecutive batches until stopped or cloudd dies; record what was sent and acknowledged."""
    try:
        _upload_until_stopped(cloudd, gateway, sent, acked, enough, stop)
    finally:
        enough.set()  # never leave the test waiting on a thread that died


def _upload_until_stopped(cloudd, gateway, sent, acked, enough, stop) -> None:
    lsn = 1
    while not stop.is_set():
        lsns = list(range(lsn, lsn + BATCH))
        sent.append(lsns)
        try:
            status, _ = upload(cloudd.url, cloudd.token_for(gateway), gateway, LOG, lsns, timeout=10)
        except OSError:
            return  # cloudd is gone: this batch was sent but never acknowledged
        assert status == 200
        acked.append(lsns)
        lsn += BATCH
        if len(acked) >= 8:
            enough.set()


def test_sigkill_mid_stream_then_restart(cloudd):
    gateways = ("gw1", "gw2")
    sent = {gw: [] for gw in gateways}
    acked = {gw: [] for gw in gateways}
    enough = {gw: threading.Event() for gw in gateways}
    stop = threading.Event()
    threads = [
        threading.Thread(target=uploader, args=(cloudd, gw, sent[gw], acked[gw], enough[gw], stop))
        for gw in gateways
    ]
    for t in threads:
        t.start()
    try:
        for gw in gateways:
            assert enough[gw].wait(120) and len(acked[gw]) >= 8, f"{gw} got too few acknowledgements"
        cloudd.kill()
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    cloudd.start()

    for gw in gateways:
        stored = Counter((r.log_id, r.lsn) for r in cloudd.records(gw))
        assert all(n == 1 for n in stored.values()), "a record is stored twice"
        acked_lsns = {lsn for batch in acked[gw] for lsn in batch}
        assert acked_lsns <= {lsn for _, lsn in stored}, "an acknowledged record is missing"

        # The gateway resends everything it has not seen acknowledged (here: all it sent, to be harsh).
        for lsns in sent[gw]:
            status, _ = upload(cloudd.url, cloudd.token_for(gw), gw, LOG, lsns)
            assert status == 200
        all_sent = sorted(lsn for batch in sent[gw] for lsn in batch)
        assert sorted(r.lsn for r in cloudd.records(gw)) == all_sent

    doc = cloudd.status()
    gateways_doc = {g["id"]: g for g in doc["gateways"]}
    for gw in gateways:
        n = sum(len(b) for b in sent[gw])
        assert gateways_doc[gw]["records"] == n
        assert [d["records"] for d in doc["devices"] if d["gateway"] == gw] == [n]


def test_sigterm_is_graceful_and_data_survives_restart(cloudd):
    assert upload(cloudd.url, cloudd.token_for("gw1"), "gw1", LOG, [1, 2, 3])[0] == 200
    assert cloudd.stop() == 0
    assert "cloudd stopping" in cloudd.log_text()
    cloudd.start()
    assert sorted(r.lsn for r in cloudd.records()) == [1, 2, 3]
    assert upload(cloudd.url, cloudd.token_for("gw1"), "gw1", LOG, [1, 2, 3])[1]["stored"] == 0
    assert cloudd.status()["totals"] == {"records": 3, "batches": 2}
