"""Simulated sensors for end-to-end tests, and the accounting of what they sent against what
cloudd stored (the exactly-once check of tests/e2e).

``start_sensors`` publishes ``messages`` QoS 1 messages from each of ``count`` devices of one
gateway on a thread of its own; ``assert_stored_exactly_once`` holds the store to exactly what the
broker acknowledged: no telemetry message lost, none stored twice, none invented.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from devices.sensors import SensorRun, SentRecord, run_sensors


def start_sensors(
    broker_url: str,
    *,
    gateway: str = "gw1",
    count: int,
    messages: int,
    rate_hz: float,
    seed: int = 0,
    on_progress: Callable[[SentRecord], None] | None = None,
) -> tuple[threading.Thread, list[SentRecord]]:
    """The publishing thread (started) and the list its ``SentRecord`` lands in when it ends."""
    result: list[SentRecord] = []
    run = SensorRun(
        broker=broker_url,
        gateway=gateway,
        count=count,
        rate_hz=rate_hz,
        duration_s=None,
        messages=messages,
        dropout_probability=0.0,
        seed=seed,
    )
    thread = threading.Thread(
        target=lambda: result.append(run_sensors(run, on_progress=on_progress)), name=f"sensors-{gateway}"
    )
    thread.start()
    return thread, result


def telemetry_counts(stored: Iterable[Any]) -> Counter:
    """How many times each (device, seq) of telemetry is among ``stored`` (``StoredRecord``s; a
    gateway's sensor-window results and markers beside them are not telemetry)."""
    return Counter(
        (r.record["device"], r.record["body"]["seq"]) for r in stored if r.record["kind"] == "telemetry"
    )


def assert_stored_exactly_once(sent: SentRecord, stored: Iterable[Any], total: int) -> None:
    counts = telemetry_counts(stored)
    expected = {(device, seq) for device, seqs in sent.sent.items() for seq in seqs}
    assert sent.total == total
    assert expected - counts.keys() == set(), "records lost"
    assert counts.keys() - expected == set(), "records stored that were never sent"
    duplicated = {key: n for key, n in counts.items() if n > 1}
    assert duplicated == {}, f"{len(duplicated)} records stored more than once"
