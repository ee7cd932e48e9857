"""Training samples that stay on the gateway: their record form and the bounded window the trainer uses.

A sample is an ``event`` record whose body is a ``protocol.federated.TrainingSample``, appended to
the gateway's *private* data log (an EpochLog the uplink never reads). ``SampleWindow`` reads new
records from that log and keeps the newest ``max_samples`` in memory (older ones dropped and
counted); it trims the log below the oldest sample it still holds, so the log holds what the window
would need again after a restart, and no more.

Invariant: ``SampleWindow`` never holds more than ``max_samples`` samples and reads each LSN once.
"""

from __future__ import annotations

import json
from collections import deque

import torch

from gateway.storage.interface import RecordLog
from protocol.federated import SAMPLE_EVENT_TYPE, TrainingSample
from protocol.records import event_record

_SAMPLE_MARK = b'"type":"training_sample"'


def sample_record(device: str, ts: float, x: torch.Tensor, y: int) -> bytes:
    body = TrainingSample(x=[round(float(v), 5) for v in x.reshape(-1)], shape=list(x.shape), y=int(y))
    return event_record(device, ts, body.model_dump())


class SampleWindow:
    def __init__(self, data_log: RecordLog, max_samples: int = 10_000) -> None:
        self._log = data_log
        self.max_samples = max_samples
        self._samples: deque[tuple[int, torch.Tensor, int]] = deque()
        self._next_lsn = data_log.trimmed_lsn + 1
        self.dropped = 0
        self.malformed = 0

    def __len__(self) -> int:
        return len(self._samples)

    async def refresh(self) -> int:
        """Read records that became durable since the last call; returns how many samples were added."""
        added = 0
        async for lsn, data in self._log.read(self._next_lsn):
            self._next_lsn = lsn + 1
            if _SAMPLE_MARK not in data:
                continue
            try:
                body = TrainingSample.model_validate(json.loads(data)["body"])
                x = torch.tensor(body.x, dtype=torch.float32).view(body.shape)
            except (ValueError, KeyError, RuntimeError):
                self.malformed += 1
                continue
            assert body.type == SAMPLE_EVENT_TYPE
            self._samples.append((lsn, x, body.y))
            added += 1
            if len(self._samples) > self.max_samples:
                self._samples.popleft()
                self.dropped += 1
        if self._samples and self._samples[0][0] - 1 > self._log.trimmed_lsn:
            await self._log.trim(self._samples[0][0] - 1)
        return added

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        xs = torch.stack([x for _, x, _ in self._samples])
        ys = torch.tensor([y for _, _, y in self._samples], dtype=torch.int64)
        return xs, ys
