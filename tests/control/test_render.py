"""What gatewayctl prints for a person (gateway/control/render.py): times as "12s ago" within the hour
and as the local time beyond (or ahead of now), log lines stamped with the local time to the
millisecond, and the notes that say a follower missed lines or the gateway restarted."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gateway.control.render import ago, log_line, log_lines, presence

NOW = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("ts", "shown"),
    [
        (NOW - 12.4, "12s ago"),
        (NOW - 0.3, "0s ago"),
        (NOW + 0.4, "0s ago"),  # another box's clock, a hair ahead
        (NOW - 425, "7m 5s ago"),
        (NOW - 3599, "59m 59s ago"),
        (NOW - 3600, "2025-12-31 23:00:00"),
        (NOW + 30, "2026-01-01 00:00:30"),  # ahead of now: when, not how long ago
    ],
)
def test_times_read_as_how_long_ago_within_the_hour_else_as_local_time(ts, shown):
    assert ago(ts, NOW) == shown


def test_log_lines_and_their_notes():
    line = {"seq": 3, "ts": NOW + 0.25, "level": "INFO", "logger": "gateway.runner", "message": "started"}
    assert log_line(line) == "2026-01-01 00:00:00.250 INFO    gateway.runner: started"
    assert log_lines({"lines": [line], "missed": 0, "restarted": False}) == [log_line(line)]
    notes = log_lines({"lines": [], "missed": 4, "restarted": True})
    assert notes == [
        "-- the gateway restarted: its lines from the start of this run --",
        "-- 4 lines were pushed out of the gateway's ring before they were read --",
    ]


def test_presence_line():
    status = {"v": 1, "state": "online", "gateway": "gw1", "ts": NOW - 5}
    assert presence("gw1", status, NOW) == "gateway gw1: online (since 5s ago)"
    assert presence("gw1", {"state": "unreadable"}, NOW) == "gateway gw1: unreadable (since ?)"
