"""Two cloudd replicas on one PostgreSQL and one shared data directory, behind a real haproxy:
simulated sensors -> real Mosquitto -> two real gatewayd -> the load balancer -> the replicas.

Replica 0 (which holds the singleton roles) is SIGKILLed while both gateways upload and while a
third uploader (the uplink's wire protocol, big batches, straight to replica 0) has a batch in
flight there. Every telemetry message is stored exactly once (counted per (gateway, device, seq);
the third uploader's per (log, lsn)), none is lost,
the survivor serves all of it and takes the roles over, and the killed replica, restarted, rejoins
as a standby that serves the same data and refuses, as a duplicate, a batch the other stored.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests.harness.cloud_http import upload
from tests.harness.cloudd import OPERATOR_TOKEN
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.haproxy import need_haproxy
from tests.harness.poll import wait_until
from tests.harness.replicas import ReplicaSet, start_replicas
from tests.harness.sensors import assert_stored_exactly_once, start_sensors, telemetry_counts

GATEWAYS = ("gw1", "gw2")
BIG_GATEWAY, BIG_LOG, BIG_BATCH = "gw3", "b16b00b5", 3000
SENSORS, MESSAGES = 2, 1500
ROLES = ("federated", "jobs", "rollout", "tasks")


def _get(url: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class BigUploader:
    """Batches of BIG_BATCH records to replica 0 until it dies; a batch cut there is sent again
    through the balancer until acknowledged (what the uplink does). ``in_flight`` is set while a
    request to replica 0 waits for its answer."""

    def __init__(self, cluster: ReplicaSet) -> None:
        self.cluster, self.sent, self.cut = cluster, [], []
        self.in_flight, self.stop = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="big-uploader")

    def _run(self) -> None:
        token, lsn, target = self.cluster.token_for(BIG_GATEWAY), 1, self.cluster.replicas[0].url
        while not self.stop.is_set():
            lsns = list(range(lsn, lsn + BIG_BATCH))
            self.sent.append(lsns)
            self.in_flight.set()
            try:
                status, _ = upload(target, token, BIG_GATEWAY, BIG_LOG, lsns, timeout=60)
            except OSError:
                self.in_flight.clear()
                self.cut.append(lsns)
                target = self.cluster.url  # the replica is gone: the balancer from now on
                wait_until(
                    lambda lsns=lsns, target=target: (
                        upload(target, token, BIG_GATEWAY, BIG_LOG, lsns)[0] == 200
                    ),
                    60,
                    "the cut batch acknowledged through the balancer",
                    ignoring=(OSError,),
                )
            else:
                self.in_flight.clear()
                assert status == 200
            lsn += BIG_BATCH


def _pending_store_calls(cluster: ReplicaSet, replica: int) -> int:
    with urllib.request.urlopen(f"{cluster.replicas[replica].url}/healthz", timeout=5) as response:
        return int(json.loads(response.read())["pending_store_calls"])


def _telemetry(cluster: ReplicaSet, gateway: str) -> Counter:
    return telemetry_counts(cluster.records(gateway))


@pytest.mark.slow
def test_replica_sigkilled_mid_upload_loses_and_doubles_nothing(
    mosquitto, postgresql_url: str, tmp_path: Path
) -> None:
    need_haproxy()
    cluster = start_replicas(tmp_path / "cloud", postgresql_url, gateways=(*GATEWAYS, BIG_GATEWAY))
    big = BigUploader(cluster)
    gateways: dict[str, Gatewayd] = {}
    try:
        assert cluster.roles(0) == dict.fromkeys(ROLES, True)
        assert cluster.roles(1) == dict.fromkeys(ROLES, False)
        for gw in GATEWAYS:
            config, port = write_config(
                tmp_path,
                mosquitto.url,
                gateway_id=gw,
                cloud_url=cluster.url,
                token=cluster.token_for(gw),
                extra='\n[devices]\nallow = ["sensor-*"]\n',
            )
            gateways[gw] = Gatewayd(config, port).wait_ready()
        publishing = {
            gw: start_sensors(
                mosquitto.url, gateway=gw, count=SENSORS, messages=MESSAGES, rate_hz=150, seed=i
            )
            for i, gw in enumerate(GATEWAYS)
        }
        threads = [thread for thread, _ in publishing.values()]

        # Mid-upload: both gateways have batches stored, their sensors are still publishing.
        wait_until(
            lambda: all(sum(_telemetry(cluster, gw).values()) >= SENSORS * MESSAGES // 4 for gw in GATEWAYS),
            120,
            "a quarter of each gateway's telemetry stored",
        )
        assert all(t.is_alive() for t in threads), "the sensors finished before the kill"
        big.thread.start()
        # The kill lands while replica 0 has the big batch in flight and is storing a batch.
        wait_until(
            lambda: big.in_flight.is_set() and _pending_store_calls(cluster, 0) > 0,
            60,
            "replica 0 storing, the big batch in flight",
        )
        cluster.replicas[0].kill()
        wait_until(lambda: big.cut, 60, "the big batch in flight cut by the kill")
        big.stop.set()
        big.thread.join(120)
        assert not big.thread.is_alive()

        # The survivor takes the singleton roles over once the dead session's locks are released.
        wait_until(lambda: cluster.roles(1) == dict.fromkeys(ROLES, True), 60, "replica 1 holds the roles")
        for t in threads:
            t.join(180)
            assert not t.is_alive()
        for gw in GATEWAYS:
            wait_until(
                lambda gw=gw: len(_telemetry(cluster, gw)) >= SENSORS * MESSAGES,
                180,
                f"all of {gw}'s telemetry stored",
            )
            wait_until(lambda gw=gw: gateways[gw].status()["uplink"]["backlog"] == 0, 60, f"{gw} drained")
        big_stored = Counter((r.log_id, r.lsn) for r in cluster.records(BIG_GATEWAY))
        assert set(big_stored) == {(BIG_LOG, lsn) for batch in big.sent for lsn in batch}, "big batch lost"
        assert set(big_stored.values()) == {1}, "a record of the big batches stored twice"
        for gw in GATEWAYS:
            assert_stored_exactly_once(publishing[gw][1][0], cluster.records(gw), SENSORS * MESSAGES)
            gateways.pop(gw).kill()  # nothing more arrives (a gateway also uploads its own events)

        # The survivor serves everything, through the balancer and directly.
        stored = {gw: len(cluster.records(gw)) for gw in (*GATEWAYS, BIG_GATEWAY)}
        of_device = sum(1 for r in cluster.records("gw1") if r.record["device"] == "sensor-000")
        for base in (cluster.url, cluster.replicas[1].url):
            status, doc = _get(f"{base}/v1/status")
            assert status == 200
            assert {g["id"]: g["records"] for g in doc["gateways"] if g["id"] in stored} == stored
            status, device = _get(f"{base}/v1/devices/gw1/sensor-000")
            assert status == 200 and device["records"] == of_device
            assert device["window"]["gaps"] == 0
        # The balancer sends each role's paths to its holder; the fleet view has both gateways.
        assert _get(f"{cluster.url}/v1/jobs")[0] == 200
        assert _get(f"{cluster.url}/v1/federated/status")[0] == 200
        fleet = _get(f"{cluster.url}/v1/fleet")[1]
        assert {g["id"] for g in fleet["gateways"]} >= set(GATEWAYS)

        # The killed replica rejoins: a standby for the roles, the same data, the same ranges.
        cluster.replicas[0].start()
        assert cluster.roles(0) == dict.fromkeys(ROLES, False)
        status, doc = _get(f"{cluster.replicas[0].url}/v1/status")
        assert {g["id"]: g["records"] for g in doc["gateways"] if g["id"] in stored} == stored
        assert _get(f"{cluster.replicas[0].url}/v1/jobs")[0] == 503  # standby
        lsns = list(range(1, 26))
        first = upload(cluster.replicas[0].url, cluster.token_for("gw1"), "gw1", "feedface02", lsns)
        again = upload(cluster.replicas[1].url, cluster.token_for("gw1"), "gw1", "feedface02", lsns)
        assert first == (200, {**first[1], "stored": 25, "duplicates": 0})
        assert again == (200, {**again[1], "stored": 0, "duplicates": 25})
    finally:
        big.stop.set()
        for gateway in gateways.values():
            gateway.kill()
        cluster.stop()
