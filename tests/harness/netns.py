"""Nodes for multi-node tests: one network namespace per node, all on one private switch.

    node ns "<tag>n0" (eth0 10.<x>.<y>.1/24) --veth--+
    node ns "<tag>n1" (eth0 10.<x>.<y>.2/24) --veth--+-- switch ns "<tag>sw" (bridge br0)
    ...

The switch is a namespace of its own, so nothing is added to the host's network: deleting the
namespaces (``nodes`` does it on exit, whatever happened) removes every interface with them. Each
node also has ``lo`` up. ``qdisc`` (a ``tc qdisc`` spec such as ``"tbf rate 200mbit burst 32kbit
latency 50ms"``, or ``"netem delay 2ms"`` where the kernel has sch_netem) shapes each node's ``eth0``
egress. Processes run in a node with ``node.command``
(``ip netns exec``); the file system is shared, as the shared checkpoint folder of a real cluster.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); ``NetnsUnavailable`` says why not.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no ``ip``, a kernel without netns)."""


@dataclass(frozen=True)
class Node:
    namespace: str
    address: str  # on eth0
    interface: str = "eth0"

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _tc(namespace: str, *args: str) -> None:
    done = subprocess.run(
        ["ip", "netns", "exec", namespace, "tc", *args], capture_output=True, text=True, timeout=30
    )
    if done.returncode:
        raise NetnsUnavailable(f"tc {' '.join(args)}: {done.stderr.strip()}")


@contextmanager
def nodes(count: int, *, qdisc: str | None = None) -> Iterator[list[Node]]:
    """``count`` nodes on one switch; removed on exit."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root")
    tag = f"ef{os.getpid() % 100_000}"  # interface and namespace names stay short and unique per test run
    subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    switch = f"{tag}sw"
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "set", "lo", "up")
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        result = []
        for i in range(count):
            node = Node(f"{tag}n{i}", f"{subnet}.{i + 1}")
            _ip("netns", "add", node.namespace)
            made.append(node.namespace)
            port = f"p{i}"
            _ip(
                "link",
                "add",
                "eth0",
                "netns",
                node.namespace,
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                switch,
            )
            _ip("-n", switch, "link", "set", port, "master", "br0")
            _ip("-n", switch, "link", "set", port, "up")
            _ip("-n", node.namespace, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip("-n", node.namespace, "link", "set", "eth0", "up")
            _ip("-n", node.namespace, "link", "set", "lo", "up")
            if qdisc:
                _tc(node.namespace, "qdisc", "add", "dev", "eth0", "root", *qdisc.split())
            result.append(node)
        yield result
    finally:
        for namespace in reversed(made):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
