"""A real load balancer for tests: haproxy (Debian's) in front of N cloudd replicas, on a free port.

The configuration is what docs/cloud.md recommends ("Replicas"): round robin over the replicas
that answer ``GET /healthz`` (checked every 300 ms, out after one miss, back after one answer; a
check may take 2 s, so a replica that is busy, not dead, stays in: with the check timing out at
the 300 ms interval, haproxy took a single replica under the fleet bench's load in and out many
times a second and answered its own 503 meanwhile; a dead one refuses the check's connection at
once);
each replica is given at most ``SERVER_MAXCONN`` requests at once, the rest wait in haproxy's queue
(in C, costing next to nothing) for up to ``QUEUE_TIMEOUT_S`` and are then answered 503 by haproxy
with a ``Retry-After`` (``BUSY_RETRY_AFTER_S``; cloudd's own 503s keep theirs): past capacity the
excess is held or shed before it reaches Python, where refusing a thousand gateways' retries took
the CPU the store needed (bench/fleet.py); the queue's timeout stays well under gatewayd's upload
timeout (``uplink.timeout_s``, 10 s), so a gateway hears the 503 rather than giving up;
a request whose connection a dead replica refused is sent to another (``retries`` +
``option redispatch``); a request cut mid-way (a replica killed while storing) is not replayed by
haproxy: the gateway retries it, and cloudd's idempotency makes that safe. The paths of a
singleton role (``ROLE_PATHS``: jobs, federated training, and the fleet view the rollout
controller judges from, heartbeats included) go to the one replica holding it (the check of its
backend is ``GET /v1/roles/<role>``, 503 elsewhere).

``need_haproxy()`` fails the test, naming the package, where haproxy is not installed (CONTRIBUTING:
a missing tool is a failure, not a skip).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.processes import free_port, start_program, stop_process, wait_for_port


def need_haproxy() -> str:
    path = shutil.which("haproxy")
    if path is None:
        pytest.fail("haproxy is not installed; the replica tests need it (apt-get install haproxy)")
    return path


# role -> the haproxy conditions of the requests only its holder serves (cloud/roles.py)
ROLE_PATHS = {
    "jobs": ("path_beg /v1/jobs",),
    "federated": ("path_beg /v1/federated",),
    "rollout": ("path_beg /v1/fleet", "path_reg ^/v1/gateways/[^/]+/heartbeat$"),
}


SERVER_MAXCONN = 8  # requests one replica serves at once; the rest wait in haproxy's queue
QUEUE_TIMEOUT_S = 5  # longest a request waits there before haproxy answers 503 itself
BUSY_RETRY_AFTER_S = 2  # the Retry-After haproxy puts on its own 503s
BUSY_WITHOUT_RETRY_AFTER = "if { status 503 } !{ res.hdr(retry-after) -m found }"  # cloudd's keep theirs


def haproxy_config(port: int, backends: list[int], maxconn: int = SERVER_MAXCONN) -> str:
    """The load balancer's whole configuration for cloudd replicas listening on ``backends``."""
    limit = f" maxconn {maxconn}" if maxconn else ""  # 0: no limit (as before it was set)
    servers = "\n".join(f"    server r{i} 127.0.0.1:{p} check{limit}" for i, p in enumerate(backends))
    routes = "\n".join(
        f"    use_backend {role} if {{ {condition} }}"
        for role, conditions in ROLE_PATHS.items()
        for condition in conditions
    )
    role_backends = "\n".join(
        f"backend {role}\n    option httpchk GET /v1/roles/{role}\n{servers}\n" for role in ROLE_PATHS
    )
    return f"""global
    maxconn 4096

defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout check 2s
    timeout queue {QUEUE_TIMEOUT_S}s
    retries 3
    option redispatch
    default-server inter 300ms fall 1 rise 1

frontend cloudd
    bind 127.0.0.1:{port}
    http-after-response set-header Retry-After {BUSY_RETRY_AFTER_S} {BUSY_WITHOUT_RETRY_AFTER}
{routes}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /healthz
{servers}

{role_backends}"""


@dataclass
class LoadBalancer:
    port: int
    config: Path
    log_path: Path
    proc: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        stop_process(self.proc)


def start_haproxy(directory: Path, backends: list[int], maxconn: int = SERVER_MAXCONN) -> LoadBalancer:
    """haproxy in the foreground with ``haproxy_config``; the caller stops it (``.stop()``)."""
    binary = need_haproxy()
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = directory / "haproxy.cfg"
    config.write_text(haproxy_config(port, backends, maxconn))
    log_path = directory / "haproxy.log"
    check = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
    if check.returncode != 0:
        raise RuntimeError(f"haproxy refused its configuration: {check.stdout}{check.stderr}")
    proc = start_program([binary, "-db", "-f", str(config)], log_path, cwd=directory)
    wait_for_port(port, proc=proc)
    return LoadBalancer(port=port, config=config, log_path=log_path, proc=proc)
