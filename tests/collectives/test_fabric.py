"""PacedFabric: when each message of a rank may leave on the emulated links (pure arithmetic)."""

from __future__ import annotations

import pytest

from cloud.training.collectives.fabric import PacedFabric, link_message_s
from cloud.training.collectives.topology import Link, Medium, Topology


def three_ranks() -> Topology:
    links = (Link(0, 1, 100.0, 0.5), Link(0, 2, 10.0, 0.0, loss=0.5), Link(1, 0, 100.0))
    return Topology(("a", "b", "c"), links)


def test_a_link_is_serial_and_links_are_independent() -> None:
    fabric = PacedFabric(three_ranks(), 0)
    assert fabric.due(1, 100, step_start=10.0) == pytest.approx(10.0 + 1.0 + 0.5)
    # the second message on 0->1 waits for the first to leave the wire (not for its latency)
    assert fabric.due(1, 100, step_start=10.0) == pytest.approx(10.0 + 2.0 + 0.5)
    # 0->2 is another link: it does not queue behind 0->1; half its packets are lost and resent
    assert fabric.due(2, 10, step_start=10.0) == pytest.approx(10.0 + 2.0)
    # a step that starts after the link freed up starts the message at once
    assert fabric.due(1, 0, step_start=50.0) == pytest.approx(50.5)
    assert fabric.messages == 4


def test_link_time_matches_its_parts() -> None:
    busy, deliver = link_message_s(Link(0, 1, 1e6, 1e-3, loss=0.2), 800_000)
    assert busy == pytest.approx(1.0) and deliver == pytest.approx(1.001)


def test_refusals_name_what_is_missing() -> None:
    with pytest.raises(ValueError, match="no link from rank 1 to rank 2"):
        PacedFabric(three_ranks(), 1).due(2, 1, 0.0)
    shared = Topology(("a", "b"), (Link(0, 1, 1.0, media=("pcie",)),), media=(Medium("pcie", 1.0),))
    with pytest.raises(ValueError, match=r"shared media \(pcie\) are not emulated"):
        PacedFabric(shared, 0)
    with pytest.raises(ValueError, match="rank 3 is not a rank"):
        PacedFabric(three_ranks(), 3)
