"""cloudd replicas as a deployment runs them: N real cloudd processes on one PostgreSQL database
and one shared data directory, behind a real haproxy (tests/harness/haproxy.py).

``start_replicas`` starts them one after the other, so replica 0 holds the singleton roles (jobs,
the task runner: cloud/roles.py) until it dies; gateways talk to ``url`` (the load balancer), and a
test kills, restarts or asks one replica through ``replicas[i]`` (a ``Cloudd``). Used by
tests/e2e/test_replicas.py and the fleet bench.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.harness.cloudd import GATEWAYS, Cloudd, make_cloudd
from tests.harness.haproxy import SERVER_MAXCONN, LoadBalancer, start_haproxy


@dataclass
class ReplicaSet:
    replicas: list[Cloudd]
    balancer: LoadBalancer
    database: str
    data_dir: Path

    @property
    def url(self) -> str:
        return self.balancer.url

    def token_for(self, gateway: str) -> str:
        return self.replicas[0].token_for(gateway)

    def records(self, gateway: str | None = None) -> list:
        """What the replicas have committed (read through the data directory's database)."""
        return self.replicas[0].records(gateway)

    def roles(self, replica: int) -> dict[str, bool] | None:
        """``GET /v1/roles`` of one replica (None when it does not answer)."""
        try:
            with urllib.request.urlopen(f"{self.replicas[replica].url}/v1/roles", timeout=5) as response:
                return json.loads(response.read())
        except (OSError, urllib.error.URLError):
            return None

    def stop(self) -> None:
        self.balancer.stop()
        for replica in self.replicas:
            replica.stop()


def start_replicas(
    base: Path,
    database: str,
    *,
    count: int = 2,
    gateways: Sequence[str] = GATEWAYS,
    extra_args: Sequence[str] = (),
    maxconn: int = SERVER_MAXCONN,
) -> ReplicaSet:
    """``count`` cloudd on ``database`` sharing ``base/shared-data``, then haproxy in front."""
    data_dir = base / "shared-data"
    replicas = [
        make_cloudd(
            base / f"replica{i}",
            gateways=gateways,
            extra_args=extra_args,
            database=database,
            data_dir=data_dir,
        )
        for i in range(count)
    ]
    started: list[Cloudd] = []
    try:
        for replica in replicas:
            replica.start()
            started.append(replica)
        balancer = start_haproxy(base / "haproxy", [r.port for r in replicas], maxconn)
    except BaseException:
        for replica in started:
            replica.stop()
        raise
    return ReplicaSet(replicas=replicas, balancer=balancer, database=database, data_dir=data_dir)
