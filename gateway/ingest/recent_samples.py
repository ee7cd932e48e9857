"""Recently logged samples, so a message the broker delivers again is not logged twice.

Why: the broker redelivers every QoS 1 message it has not seen acknowledged. A gateway killed
after its log made a record durable but before the PUBACK left gets that message again on the
next start; appended again, it would reach the cloud as a second record. A sample is named by
(device, seq, ts): a redelivery is byte-identical, and a device that restarts its counter
stamps a new time. The window is bounded (the broker redelivers at most its in-flight window
plus its queue for us) and is seeded at start from the newest records of the log.

Invariant: a key is remembered only after its record was appended to the log.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import AsyncIterator

SampleKey = tuple[str, int, float]


class RecentSamples:
    def __init__(self, capacity: int = 16_384) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[SampleKey, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def remember(self, key: SampleKey) -> None:
        self._keys[key] = None
        if len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    async def seed(self, records: AsyncIterator[tuple[int, bytes]]) -> int:
        """Remember the telemetry samples among ``records`` (the log's newest); return how many."""
        seeded = 0
        async for _, data in records:
            record = json.loads(data)
            if record.get("kind") == "telemetry":
                body = record["body"]
                self.remember((body["device"], body["seq"], body["ts"]))
                seeded += 1
        return seeded
