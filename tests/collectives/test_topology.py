"""topology: the file format round-trips (JSON and TOML), bad input names its field; subsets
renumber; the generated fabrics have the links the hardware has (DGX-1's NVLink matrix)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloud.training.collectives import fabrics
from cloud.training.collectives.topology import Link, Medium, Topology, TopologyError, dump, from_dict, load


def three_ranks() -> Topology:
    links = (Link(0, 1, 1e9, 1e-6, 0.001, 2.0, ("m",)), Link(1, 0, 2e9), Link(1, 2, 3e9))
    return Topology(("a", "b", "c"), links, ("h0", "h0", "h1"), (Medium("m", 5e8),))


def test_json_round_trip(tmp_path: Path) -> None:
    topology = three_ranks()
    dump(topology, tmp_path / "fabric.json")
    again = load(tmp_path / "fabric.json")
    assert again == topology
    assert again.link(0, 1) == Link(0, 1, 1e9, 1e-6, 0.001, 2.0, ("m",))
    assert again.link(2, 1) is None


def test_toml_with_bidirectional_links(tmp_path: Path) -> None:
    (tmp_path / "fabric.toml").write_text(
        '[[rank]]\nname = "x"\n[[rank]]\nname = "y"\nhost = "other"\n'
        '[[link]]\nsrc = "x"\ndst = "y"\nbandwidth = 4e9\nloss = 1e-5\nbidirectional = true\n'
    )
    topology = load(tmp_path / "fabric.toml")
    assert topology.hosts == ("x", "other")
    assert topology.link(1, 0) == Link(1, 0, 4e9, 0.0, 1e-5)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["link"][1].update(bandwidth=-1), "link[1].bandwidth"),
        (lambda d: d["link"][0].update(bandwidth="fast"), "link[0].bandwidth"),
        (lambda d: d["link"][2].update(loss=1.0), "link[2].loss"),
        (lambda d: d["link"][2].update(latency=-0.1), "link[2].latency"),
        (lambda d: d["link"][0].update(dst="nobody"), "link[0].dst"),
        (lambda d: d["link"][0].update(media=["nic"]), "link[0].media"),
        (lambda d: d["link"][0].pop("bandwidth"), "link[0].bandwidth"),
        (lambda d: d["link"][0].update(colour="red"), "link[0]"),
        (lambda d: d["link"].append(dict(d["link"][0])), "link[3]"),
        (lambda d: d["link"][1].update(dst="b"), "link[1]"),
        (lambda d: d["rank"][1].update(name=""), "rank[1].name"),
        (lambda d: d["rank"].append({"name": "a"}), "rank"),
        (lambda d: d["medium"][0].update(bandwidth=0), "medium[0].bandwidth"),
        (lambda d: d.update(links=[]), "links"),
    ],
)
def test_bad_documents_name_the_field(change, field: str) -> None:
    document = json.loads(json.dumps(three_ranks().to_dict()))
    change(document)
    with pytest.raises(TopologyError, match=field.replace("[", r"\[").replace("]", r"\]")):
        from_dict(document)


def test_invalid_file_text_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TopologyError, match="not valid JSON"):
        load(tmp_path / "bad.json")


def test_subset_renumbers_in_the_given_order() -> None:
    sub = three_ranks().subset([2, 1])
    assert sub.names == ("c", "b")
    assert sub.link(1, 0) == Link(1, 0, 3e9)  # b -> c
    assert sub.link(0, 1) is None
    assert sub.media == ()  # only link 0->1 (gone) used the medium


def test_dgx1_has_the_nvlink_matrix() -> None:
    full = fabrics.dgx1()
    assert full.world == 8 and len(full.links) == 56
    for gpu in range(8):  # six NVLinks per V100
        nvlink = sum(link.bandwidth for link in full.links if link.src == gpu and not link.media)
        assert nvlink == 6 * fabrics.NVLINK_BW
    assert full.link(0, 3).bandwidth == 2 * fabrics.NVLINK_BW
    assert full.link(0, 1).bandwidth == fabrics.NVLINK_BW
    assert full.link(0, 5).media == ("pcie0:out", "pcie5:in", "qpi:0>1")  # no NVLink: PCIe across sockets
    assert full.link(4, 7).media == ()


def test_dgx1_allocation_keeps_its_gpus_names() -> None:
    sub = fabrics.dgx1((5, 0, 6))
    assert sub.names == ("gpu5", "gpu0", "gpu6")
    assert sub.link(0, 2).bandwidth == 2 * fabrics.NVLINK_BW  # 5-6: two NVLinks
    assert sub.link(1, 2).media == ("pcie0:out", "pcie6:in", "qpi:0>1")
    # 8 choose 3 + ... + 8 choose 7
    assert len(fabrics.dgx1_allocations()) == 56 + 70 + 56 + 28 + 8


def test_multi_machine_and_mixed_reliability() -> None:
    fabric = fabrics.mixed_reliability(3, 2, reliable_machines=[0, 1])
    assert fabric.world == 6 and fabric.hosts == ("m0", "m0", "m1", "m1", "m2", "m2")
    assert fabric.link(0, 1).media == () and fabric.link(0, 1).loss == 0.0
    assert fabric.link(0, 2).media == ("nic0:out", "nic1:in")
    assert fabric.link(1, 3).loss == fabrics.RELIABLE_LOSS
    assert fabric.link(0, 4).loss == fabrics.CHEAP_LOSS
    # the optics cost once per ordered machine pair: 2 reliable, 4 cheap
    assert sum(link.cost for link in fabric.links) == pytest.approx(2 * 1.0 + 4 * fabrics.CHEAP_COST)


def test_ring_and_pcie_only() -> None:
    assert len(fabrics.ring(2, 1.0).links) == 2
    assert len(fabrics.ring(5, 1.0).links) == 10
    pair = fabrics.pcie_only(2)
    assert pair.link(0, 1).media == ("pcie0:out", "pcie1:in")
