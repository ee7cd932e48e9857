"""JobEvents: one job's progress lines as a numbered sequence that streams can follow.

The job's owner task is the only writer (``extend``); readers (the SSE handlers, GET /v1/jobs/{id})
take ``since(n)`` slices and ``wait`` for more. ``tail_lines`` is the pure part of following a
JSON-lines file that is still being appended to.

``summary`` is what /v1/jobs/{id} shows of the events: the latest step's figures, ``features``
(the start event's), ``live`` (per feature, the sub-object of the latest step that carried one),
``phase`` (the latest phase event's) and the step rate that ``eta_s`` extrapolates.

Invariant: event numbers (``seq``) start at 0 and increase by one per kept event, so a reader that
resumes with ``since=n`` sees each event once; when ``max_events`` is reached further ``step``
lines are dropped (counted in ``dropped``; the progress file on disk keeps them all), other events
are always kept.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from runtime.tasks import wait_event

MAX_EVENTS = 200_000


def tail_lines(chunk: bytes) -> tuple[list[dict[str, Any]], int]:
    """(whole JSON lines in ``chunk``, bytes consumed): an unterminated last line waits for more;
    a whole line that is not JSON (torn by a crash, then appended to) is skipped."""
    records: list[dict[str, Any]] = []
    consumed = 0
    while True:
        end = chunk.find(b"\n", consumed)
        if end < 0:
            return records, consumed
        line, consumed = chunk[consumed:end], end + 1
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            records.append(value)


class JobEvents:
    def __init__(self, max_events: int = MAX_EVENTS) -> None:
        self.max_events = max_events
        self.events: list[dict[str, Any]] = []
        self.dropped = 0
        self.closed = False  # no more events will come (the job ended, or cloudd is stopping)
        self.summary: dict[str, Any] = {
            "step": 0,
            "total_steps": None,
            "loss": None,
            "accuracy": None,
            "eval_loss": None,
            "samples_per_s": None,
            "epoch": None,
            "features": None,
            "live": {},
            "phase": None,
        }
        self._first_step: tuple[int, float] | None = None  # (step, time) of the first step line seen
        self._last_step: tuple[int, float] | None = None
        self._changed = asyncio.Event()

    def extend(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            if record.get("event") == "step" and len(self.events) >= self.max_events:
                self.dropped += 1
                self._summarise(record)
                continue
            self.events.append({**record, "seq": len(self.events)})
            self._summarise(record)
        if records:
            self._notify()

    def close(self) -> None:
        self.closed = True
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _summarise(self, record: dict[str, Any]) -> None:
        kind, summary = record.get("event"), self.summary
        if kind == "start":
            summary["total_steps"] = record.get("total_steps")
            summary["features"] = record.get("features", summary["features"])
        elif kind == "phase":
            summary["phase"] = record.get("phase")
        elif kind == "step":
            for key in ("step", "loss", "samples_per_s", "epoch"):
                summary[key] = record.get(key, summary[key])
            # a feature's figures are the step's sub-objects (compression, sync, balance, toggle, ...)
            summary["live"].update({k: v for k, v in record.items() if isinstance(v, dict)})
            if isinstance(record.get("step"), int) and isinstance(record.get("time"), int | float):
                mark = (record["step"], float(record["time"]))
                self._first_step = self._first_step or mark
                self._last_step = mark
        elif kind == "eval":
            summary["accuracy"] = record.get("accuracy")
            summary["eval_loss"] = record.get("loss")

    def eta_s(self) -> float | None:
        """Seconds left to the last step at the rate of the steps seen so far (None: no rate yet)."""
        total = self.summary["total_steps"]
        if not total or self._first_step is None or self._last_step is None:
            return None
        (first, t0), (last, t1) = self._first_step, self._last_step
        if last >= total:
            return 0.0
        if last <= first or t1 <= t0:
            return None
        return round((total - last) * (t1 - t0) / (last - first), 1)

    def since(self, n: int) -> list[dict[str, Any]]:
        return self.events[max(0, n) :]

    async def wait(self, n: int, timeout_s: float) -> bool:
        """Wait until there is an event numbered >= n or the stream closed; False on timeout."""
        if len(self.events) > n or self.closed:
            return True
        changed = self._changed
        return await wait_event(changed, timeout_s)
