"""models.sensing: the sensor windows both sides cut the same way, and the aggregate and detect tasks."""

from __future__ import annotations

import random

from models.sensing import WindowBook, aggregate, detect
from protocol.derived import Bounds, PlacementMarker, SensorParams

EDGE = {"aggregate": "edge", "detect": "edge"}
CLOUD = {"aggregate": "cloud", "detect": "cloud"}


def sample(value: float, status: str = "ok") -> dict:
    return {
        "v": 1,
        "device": "d",
        "seq": 0,
        "ts": 0.0,
        "readings": {"temperature_c": value},
        "status": status,
    }


def marker(sides, window_s=1.0, **bounds) -> PlacementMarker:
    params = SensorParams(window_s=window_s, bounds={k: Bounds(**v) for k, v in bounds.items()})
    return PlacementMarker(service="sensor", sides=sides, plan=1, reason="plan", sensor=params)


def test_a_device_window_closes_at_its_next_window_and_aggregates_what_it_held():
    book = WindowBook(EDGE, SensorParams(window_s=1.0))
    assert book.feed(1, "a", 10.1, sample(20.0)) == []
    assert book.feed(2, "a", 10.5, sample(22.0)) == []
    (closed,) = book.feed(3, "a", 11.2, sample(30.0))
    agg = aggregate(closed)
    assert (agg.window.first_lsn, agg.window.last_lsn, agg.window.start_ts, agg.samples) == (1, 2, 10.0, 2)
    stats = agg.readings["temperature_c"]
    assert (stats.count, stats.mean, stats.min, stats.max) == (2, 21.0, 20.0, 22.0)
    assert agg.ran_at == EDGE


def test_a_silent_devices_window_closes_one_window_of_grace_later_by_any_record():
    book = WindowBook(EDGE, SensorParams(window_s=1.0))
    book.feed(1, "quiet", 10.2, sample(1.0))
    assert book.feed(2, "busy", 11.9, sample(1.0)) == []  # still within the grace window
    closed = book.feed(3, "busy", 12.0, sample(1.0))  # quiet's window by time, busy's by its own next
    assert [(w.device, w.index) for w in closed] == [("quiet", 10), ("busy", 11)]
    assert book.close_due(13.9) == []
    assert [(w.device, w.index) for w in book.close_due(14.0)] == [("busy", 12)]


def test_a_marker_closes_every_window_and_sides_change_only_for_later_windows():
    book = WindowBook(EDGE, SensorParams(window_s=1.0))
    book.feed(1, "a", 10.1, sample(1.0))
    book.feed(2, "b", 10.2, sample(1.0))
    closed = book.feed_marker(marker(CLOUD))
    assert [(w.device, w.sides) for w in closed] == [("a", EDGE), ("b", EDGE)]
    book.feed(4, "a", 10.3, sample(1.0))  # same receive window, new ownership epoch
    (after,) = book.close_all()
    assert (after.first_lsn, after.sides) == (4, CLOUD)


def test_the_edge_with_its_silence_timer_cuts_the_same_windows_as_the_cloud_without_one():
    """The edge also closes windows on a timer between records (``close_due``); the cloud replays the
    records alone. Receive times only grow, so both end with the same windows."""
    rng = random.Random(3)
    records, t = [], 100.0
    for lsn in range(1, 3000):
        t += rng.expovariate(5) if rng.random() < 0.9 else rng.uniform(1, 4)  # bursts and silences
        if rng.random() < 0.01:
            sides, window_s = rng.choice([EDGE, CLOUD]), rng.choice([0.5, 1.0])
            records.append((lsn, "marker", t, marker(sides, window_s=window_s)))
        else:
            records.append((lsn, rng.choice("abc"), t, sample(rng.gauss(20, 5))))

    def replay(timer: bool) -> set[tuple]:
        book, windows, last_ts = WindowBook(EDGE, SensorParams()), [], 100.0
        for lsn, device, ts, body in records:
            if timer:
                windows += book.close_due(rng.uniform(last_ts, ts))
            closed = book.feed_marker(body) if device == "marker" else book.feed(lsn, device, ts, body)
            windows += closed
            last_ts = ts
        windows += book.close_all()
        return {(w.device, w.first_lsn, w.last_lsn, w.samples, tuple(w.sides.values())) for w in windows}

    edge, cloud = replay(timer=True), replay(timer=False)
    assert edge == cloud
    assert sum(w[3] for w in cloud) == sum(1 for r in records if r[1] != "marker")  # each sample once


def test_detect_flags_a_mean_out_of_bounds_and_faults():
    params = SensorParams(bounds={"temperature_c": Bounds(low=0.0, high=40.0)})
    book = WindowBook(EDGE, params)
    book.feed(1, "a", 1.1, sample(45.0))
    book.feed(2, "a", 1.2, sample(47.0))
    hot = detect(aggregate(book.close_all()[0]), params)
    assert hot.anomalous and hot.severity == "alert" and hot.score == (46.0 - 40.0) / 40.0
    assert hot.reasons == ["temperature_c mean 46 > high 40"]
    book.feed(3, "a", 2.1, sample(20.0))
    book.feed(4, "a", 2.2, sample(21.0, status="fault"))
    faulty = detect(aggregate(book.close_all()[0]), params)
    assert faulty.anomalous and faulty.reasons == ["1 of 2 samples reported a fault"]
    book.feed(5, "a", 3.1, sample(20.0))
    calm = detect(aggregate(book.close_all()[0]), params)
    assert not calm.anomalous and calm.severity == "info" and calm.score == 0.0
