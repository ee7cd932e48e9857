"""The ingest's figures per device (gateway/ingest/device_stats.py): bounded to the most recently
heard devices, with every message accounted for: in a kept device's count, a forgotten device's, or
the count of topics that name no device."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.ingest.device_stats import DeviceStats


def topic(device: str) -> str:
    return f"edgefed/gw1/devices/{device}/telemetry"


def test_only_the_most_recently_heard_are_kept_and_the_rest_counted():
    stats = DeviceStats(capacity=3)
    for n, device in enumerate(["a", "b", "c", "a", "d", "e"]):
        stats.record(topic(device), 100.0 + n, "accepted")
    view = stats.view(["a", "e*"])
    assert [d["device"] for d in view["devices"]] == ["e", "d", "a"]  # b and c were heard longest ago
    assert view["forgotten"] == 2 and view["capacity"] == 3
    a = view["devices"][2]
    assert (a["first_ts"], a["last_ts"], a["messages"], a["allowed"]) == (100.0, 103.0, 2, True)
    assert view["devices"][1]["allowed"] is False


def test_outcomes_and_topics_without_a_device():
    stats = DeviceStats()
    stats.record(topic("s1"), 1.0, "accepted")
    stats.record(topic("s1"), 2.0, "redelivered")
    stats.record(topic("s1"), 3.0, "log_full")
    stats.record("edgefed/gw1/devices/not a device/telemetry", 4.0, "unknown_topic")
    stats.record("somewhere/else", 5.0, "unknown_topic")
    view = stats.view(["*"])
    (s1,) = view["devices"]
    assert (s1["accepted"], s1["redelivered"], s1["rejected"]) == (1, 1, {"log_full": 1})
    assert view["unattributed"] == 2


@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", "e", "f"]), st.booleans()), max_size=50),
    st.integers(1, 4),
)
def test_every_message_is_accounted_for(messages, capacity):
    stats = DeviceStats(capacity=capacity)
    forgotten_messages = evictions = 0
    for n, (device, accepted) in enumerate(messages):
        before = {d["device"]: d["messages"] for d in stats.view([])["devices"]}
        stats.record(topic(device), float(n), "accepted" if accepted else "invalid")
        after = {d["device"] for d in stats.view([])["devices"]}
        gone = [name for name in before if name not in after]
        evictions += len(gone)
        forgotten_messages += sum(before[name] for name in gone)
    view = stats.view([])
    assert len(view["devices"]) <= capacity and view["forgotten"] == evictions
    assert sum(d["messages"] for d in view["devices"]) + forgotten_messages == len(messages)
    assert all(d["messages"] == d["accepted"] + sum(d["rejected"].values()) for d in view["devices"])
