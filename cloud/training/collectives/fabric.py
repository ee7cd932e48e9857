"""An emulated fabric: per directed pair of ranks, a bandwidth, a latency and a loss rate, paced
on the sending side of the real transport.

gloo over loopback runs every pair at the same (memory) speed, and this kernel has tbf but no
netem, so tests and benchmarks cannot make a fragmented allocation out of real links. The executor
instead asks ``PacedFabric`` when each send may go: a directed link is a serial resource, so a
message leaves when the link is free and it has been paid for, ``latency + bytes / (bandwidth *
(1 - loss))``: a lossy link resends its lost share, so it delivers only the rest of its bandwidth
(the expected delay, not a random draw; ``simulate`` models a link the same way, so it can predict
a run). Links are independent, as a DGX's NVLinks and PCIe lanes are; the
executor sleeps until the earliest due send (a sleep releases the GIL and burns no CPU, as a NIC
sending looks to its host), posts it, and so on. The transport's own time adds to the emulated
one; links much slower than loopback keep it small. One difference from ``simulate``: a message's
clock starts when its sender's step begins, not once its receiver has reached the step too.

Invariant: on one directed link, messages leave in the order the program posts them, and no
message leaves before ``link_message_s`` after both its step began and the link's previous
message left.
"""

from __future__ import annotations

import threading

from cloud.training.collectives.topology import Link, Topology


def link_message_s(link: Link, nbytes: int) -> tuple[float, float]:
    """(seconds the link is busy with the message, seconds until it is delivered) for ``nbytes``:
    its lost share resent (each byte crosses 1 / (1 - loss) times on average), after the latency."""
    busy = nbytes / (link.bandwidth * (1 - link.loss))
    return busy, busy + link.latency


class PacedFabric:
    """The sending side of an emulated fabric for one rank: when each of its messages may leave.
    Shared by every executor of the rank (thread-safe): two lanes share the links, as on hardware."""

    def __init__(self, topology: Topology, rank: int) -> None:
        if topology.media:
            raise ValueError(
                "the paced fabric emulates independent links; shared media "
                f"({', '.join(m.name for m in topology.media)}) are not emulated"
            )
        if not 0 <= rank < topology.world:
            raise ValueError(f"rank {rank} is not a rank of the {topology.world}-rank topology")
        self.topology = topology
        self.rank = rank
        self._lock = threading.Lock()
        self._link_free_at: dict[int, float] = {}  # peer -> monotonic time the link frees up
        self.messages = 0  # sends paced, for tests and reports
        self.emulated_s = 0.0  # link time charged

    def due(self, peer: int, nbytes: int, step_start: float) -> float:
        """The monotonic time a message of ``nbytes`` to ``peer`` posted at ``step_start`` is
        delivered; the link is busy until then minus its latency."""
        link = self.topology.link(self.rank, peer)
        if link is None:
            raise ValueError(f"the fabric has no link from rank {self.rank} to rank {peer}")
        busy, deliver = link_message_s(link, nbytes)
        with self._lock:
            start = max(step_start, self._link_free_at.get(peer, 0.0))
            self._link_free_at[peer] = start + busy
            self.messages += 1
            self.emulated_s += deliver
        return start + deliver
