"""The rings behind ``log.errors`` (gateway/control/recent_log.py), fed by a real logger: a reader
following a ring with its cursor sees every line once, in order, or is told how many were pushed out
before it read them; a cursor from another run starts over; a bad cursor is refused, naming ``after``."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.control.recent_log import RecentLog
from protocol.control import ControlError


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("test.recent_log")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger
    logger.handlers.clear()


def attach(logger: logging.Logger, warning_lines: int = 5, info_lines: int = 8) -> RecentLog:
    logger.handlers.clear()
    recent = RecentLog(warning_lines=warning_lines, info_lines=info_lines)
    logger.addHandler(recent)
    return recent


def messages(answer: dict) -> list[str]:
    return [line["message"] for line in answer["lines"]]


def test_info_lines_have_their_own_ring_and_never_push_out_warnings(logger):
    recent = attach(logger)
    logger.warning("disk slow")
    for n in range(20):
        logger.info("chatter %d", n)
    logger.debug("never kept")
    assert messages(recent.read("WARNING", 50)) == ["disk slow"]
    info = recent.read("INFO", 50)
    assert messages(info) == [f"chatter {n}" for n in range(12, 20)]  # the last 8: INFO and up
    assert info["dropped"] == 13 and [line["seq"] for line in info["lines"]] == list(range(14, 22))
    logger.error("broken")
    assert messages(recent.read("ERROR", 50)) == ["broken"]
    assert messages(recent.read("WARNING", 1)) == ["broken"]  # the last one


def test_following_shows_each_line_once_and_counts_what_the_ring_pushed_out(logger):
    recent = attach(logger)
    first = recent.read("WARNING", 50)
    assert first["lines"] == [] and first["missed"] == 0
    logger.warning("a")
    logger.info("not a warning")
    logger.warning("b")
    got = recent.read("WARNING", 50, first["next"])
    assert messages(got) == ["a", "b"] and got["missed"] == 0
    again = recent.read("WARNING", 50, got["next"])
    assert again["lines"] == [] and again["next"] == got["next"]  # nothing new: nothing twice
    for n in range(8):  # 5 are kept: c0..c2 are pushed out before anyone reads them
        logger.warning("c%d", n)
    later = recent.read("WARNING", 2, got["next"])
    assert messages(later) == ["c3", "c4"] and later["missed"] == 3
    rest = recent.read("WARNING", 50, later["next"])
    assert messages(rest) == ["c5", "c6", "c7"] and rest["missed"] == 0


def test_error_filters_the_warning_ring_and_its_cursor_reads_on(logger):
    recent = attach(logger)
    start = recent.read("ERROR", 50)["next"]
    logger.warning("w1")
    logger.error("e1")
    logger.warning("w2")
    got = recent.read("ERROR", 50, start)
    assert messages(got) == ["e1"]
    logger.error("e2")
    assert messages(recent.read("ERROR", 50, got["next"])) == ["e2"]  # w2 is not waiting in between


def test_a_cursor_of_another_run_reads_this_one_from_its_start(logger):
    old = attach(logger)
    logger.warning("before the restart")
    cursor = old.read("WARNING", 50)["next"]
    new = attach(logger)
    logger.warning("after the restart")
    got = new.read("WARNING", 50, cursor)
    assert got["restarted"] is True and messages(got) == ["after the restart"] and got["missed"] == 0


@pytest.mark.parametrize(
    ("cursor", "says"),
    [
        ("nonsense", "is not a cursor"),
        ("abc-warning-x", "is not a cursor"),
        ("abc-nowhere-1", "is not a cursor"),
        (None, "is past the newest line"),  # this run's, from the future
        ("info", "is a cursor of the info lines, not of the warning lines"),  # of the other ring
    ],
)
def test_a_bad_cursor_is_refused_naming_after(logger, cursor, says):
    recent = attach(logger)
    if cursor is None:
        cursor = f"{recent.run}-warning-7"
    elif cursor == "info":
        cursor = recent.read("INFO", 1)["next"]
    with pytest.raises(ControlError) as refused:
        recent.read("WARNING", 10, cursor)
    assert refused.value.field == "after" and says in refused.value.why


# one step: log a line at a level, or read with a limit
steps = st.lists(
    st.one_of(
        st.sampled_from([logging.INFO, logging.WARNING, logging.ERROR]).map(lambda level: ("log", level)),
        st.integers(1, 4).map(lambda limit: ("read", limit)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(steps=steps, level=st.sampled_from(["INFO", "WARNING", "ERROR"]))
def test_a_follower_accounts_for_every_line_exactly_once(steps, level):
    logger = logging.getLogger("test.recent_log.property")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.handlers.clear()
    recent = RecentLog(warning_lines=3, info_lines=4)
    logger.addHandler(recent)
    try:
        wanted = logging.getLevelNamesMapping()[level]
        ring_level = logging.INFO if level == "INFO" else logging.WARNING
        logged: list[tuple[int, str]] = []  # every line the followed ring takes
        seen: list[str] = []
        missed = 0
        cursor = recent.read(level, 1)["next"]
        for kind, value in [*steps, ("read", 500)]:
            if kind == "log":
                text = f"line {len(logged)}"
                logger.log(value, text)
                if value >= ring_level:
                    logged.append((value, text))
            else:
                answer = recent.read(level, value, cursor)
                seen += messages(answer)
                missed += answer["missed"]
                cursor = answer["next"]
        ring = [text for _, text in logged]
        wanted_lines = [text for lvl, text in logged if lvl >= wanted]
        # seen in order, none twice: a subsequence of the wanted lines
        assert len(set(seen)) == len(seen)
        assert [text for text in wanted_lines if text in seen] == seen
        # the last read took everything still kept: only lines the ring pushed out are not seen
        kept = ring[-(4 if level == "INFO" else 3) :]
        assert all(text in seen for text in wanted_lines if text in kept)
        if level != "ERROR":  # the ring holds only this level and up: the count is exact
            assert missed == len(wanted_lines) - len(seen)
        else:  # missed counts the ring's WARNING lines too
            assert len(wanted_lines) - len(seen) <= missed <= len(ring) - len(seen)
    finally:
        logger.handlers.clear()
