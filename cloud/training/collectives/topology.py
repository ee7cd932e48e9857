"""A fabric as data: ranks, the directed links between them, and the shared media links draw on.

A ``Topology`` names its ranks (rank i is ``names[i]`` on machine ``hosts[i]``) and holds at most
one directed ``Link`` per ordered pair, with its bandwidth (bytes/s), latency (s), loss rate (the
fraction of packets lost or corrupted on it) and cost (any unit, summed by ``reliability``). A
link may also draw on shared ``Medium`` capacities (a GPU's PCIe port, a socket interconnect, a
machine's NIC): every transfer over a link uses the link and each of its media at once, so
concurrent transfers divide the smallest of them.

The file format (JSON, or TOML for hand-written files; ``load``/``dump``; docs/collectives.md):
``rank`` = list of {name, host?}; ``link`` = list of {src, dst, bandwidth, latency?, loss?, cost?,
media?, bidirectional?} naming ranks; ``medium`` = list of {name, bandwidth}. Bad input raises
``TopologyError`` naming the field (``link[3].bandwidth``).

Invariant: ranks are 0..world-1; every link joins two different ranks of the topology, no ordered
pair has two links, every bandwidth is positive, every latency and cost non-negative, every loss
in [0, 1), and every medium a link names exists. Generators for the fabrics the benchmarks use
live in ``fabrics``.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


class TopologyError(ValueError):
    """A topology (or its file) that breaks the invariant; the message names the field."""


@dataclass(frozen=True)
class Link:
    src: int
    dst: int
    bandwidth: float  # bytes/s
    latency: float = 0.0  # s, per message
    loss: float = 0.0  # fraction of packets lost or corrupted
    cost: float = 0.0
    media: tuple[str, ...] = ()


@dataclass(frozen=True)
class Medium:
    """A capacity several links share (bytes/s in total)."""

    name: str
    bandwidth: float


@dataclass(frozen=True)
class Topology:
    names: tuple[str, ...]
    links: tuple[Link, ...]
    hosts: tuple[str, ...] = ()  # empty: every rank is its own host
    media: tuple[Medium, ...] = ()
    _by_pair: dict[tuple[int, int], Link] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.hosts:
            object.__setattr__(self, "hosts", self.names)
        _check(self)
        self._by_pair.update({(link.src, link.dst): link for link in self.links})

    @property
    def world(self) -> int:
        return len(self.names)

    def link(self, src: int, dst: int) -> Link | None:
        return self._by_pair.get((src, dst))

    def medium(self, name: str) -> Medium:
        return next(m for m in self.media if m.name == name)

    def rank(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise TopologyError(f"no rank named {name!r}") from None

    def subset(self, ranks: Sequence[int]) -> Topology:
        """The fabric of these ranks only, renumbered 0..len-1 in the given order (an allocation)."""
        if len(set(ranks)) != len(ranks) or not all(0 <= r < self.world for r in ranks):
            raise TopologyError(f"subset {list(ranks)} is not a list of distinct ranks of {self.world}")
        new = {old: i for i, old in enumerate(ranks)}
        links = tuple(
            replace(link, src=new[link.src], dst=new[link.dst])
            for link in self.links
            if link.src in new and link.dst in new
        )
        used = {m for link in links for m in link.media}
        return Topology(
            names=tuple(self.names[r] for r in ranks),
            hosts=tuple(self.hosts[r] for r in ranks),
            links=links,
            media=tuple(m for m in self.media if m.name in used),
        )

    def only_links(self, keep: Iterable[Link]) -> Topology:
        """The same ranks with only the given links (and the media those still use)."""
        links = tuple(keep)
        used = {m for link in links for m in link.media}
        return Topology(self.names, links, self.hosts, tuple(m for m in self.media if m.name in used))

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": [{"name": n, "host": h} for n, h in zip(self.names, self.hosts, strict=True)],
            "link": [
                {
                    "src": self.names[link.src],
                    "dst": self.names[link.dst],
                    "bandwidth": link.bandwidth,
                    "latency": link.latency,
                    "loss": link.loss,
                    "cost": link.cost,
                    "media": list(link.media),
                }
                for link in self.links
            ],
            "medium": [{"name": m.name, "bandwidth": m.bandwidth} for m in self.media],
        }


def _check(topology: Topology) -> None:
    if not topology.names:
        raise TopologyError("rank: a topology needs at least one rank")
    if len(set(topology.names)) != len(topology.names):
        raise TopologyError(f"rank: names are not unique: {list(topology.names)}")
    if len(topology.hosts) != len(topology.names):
        raise TopologyError(f"hosts: {len(topology.hosts)} for {len(topology.names)} ranks")
    media = {m.name for m in topology.media}
    if len(media) != len(topology.media):
        raise TopologyError("medium: names are not unique")
    for i, medium in enumerate(topology.media):
        _positive(f"medium[{i}].bandwidth", medium.bandwidth)
    seen: set[tuple[int, int]] = set()
    for i, link in enumerate(topology.links):
        where = f"link[{i}]"
        for end in ("src", "dst"):
            value = getattr(link, end)
            if not isinstance(value, int) or not 0 <= value < topology.world:
                raise TopologyError(f"{where}.{end}: {value!r} is not a rank of {topology.world}")
        if (link.src, link.dst) in seen:
            raise TopologyError(f"{where}: a second link from {link.src} to {link.dst}")
        seen.add((link.src, link.dst))
        _check_link(where, link)
        for name in link.media:
            if name not in media:
                raise TopologyError(f"{where}.media: no medium named {name!r}")


def _check_link(where: str, link: Link) -> None:
    if link.src == link.dst:
        raise TopologyError(f"{where}: joins rank {link.src} to itself")
    _positive(f"{where}.bandwidth", link.bandwidth)
    _non_negative(f"{where}.latency", link.latency)
    _non_negative(f"{where}.cost", link.cost)
    if isinstance(link.loss, bool) or not isinstance(link.loss, int | float) or not 0.0 <= link.loss < 1.0:
        raise TopologyError(f"{where}.loss: must be in [0, 1), got {link.loss!r}")


def _positive(where: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise TopologyError(f"{where}: must be a positive number, got {value!r}")


def _non_negative(where: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise TopologyError(f"{where}: must be a non-negative number, got {value!r}")


_RANK_KEYS = {"name", "host"}
_LINK_KEYS = {"src", "dst", "bandwidth", "latency", "loss", "cost", "media", "bidirectional"}
_MEDIUM_KEYS = {"name", "bandwidth"}


def from_dict(document: Mapping[str, Any]) -> Topology:
    """Build a topology from the file format's document (see the module docstring)."""
    unknown = set(document) - {"rank", "link", "medium"}
    if unknown:
        raise TopologyError(f"unknown top-level field(s) {sorted(unknown)}; expected rank, link, medium")
    names, hosts = _ranks(_table(document, "rank", _RANK_KEYS))
    links = _links(_table(document, "link", _LINK_KEYS), {name: i for i, name in enumerate(names)})
    media = []
    for i, entry in enumerate(_table(document, "medium", _MEDIUM_KEYS)):
        if not isinstance(entry.get("name"), str):
            raise TopologyError(f"medium[{i}].name: must be a string, got {entry.get('name')!r}")
        if "bandwidth" not in entry:
            raise TopologyError(f"medium[{i}].bandwidth: missing")
        media.append(Medium(entry["name"], entry["bandwidth"]))
    return Topology(tuple(names), tuple(links), tuple(hosts), tuple(media))


def _ranks(entries: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    names: list[str] = []
    hosts: list[str] = []
    for i, entry in enumerate(entries):
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise TopologyError(f"rank[{i}].name: must be a non-empty string, got {name!r}")
        host = entry.get("host", name)
        if not isinstance(host, str) or not host:
            raise TopologyError(f"rank[{i}].host: must be a non-empty string, got {host!r}")
        names.append(name)
        hosts.append(host)
    return names, hosts


def _links(entries: list[dict[str, Any]], index: dict[str, int]) -> list[Link]:
    """The file's links, checked one by one so that an error names the entry as written."""
    links: list[Link] = []
    for i, entry in enumerate(entries):
        where = f"link[{i}]"
        ends = []
        for end in ("src", "dst"):
            if entry.get(end) not in index:
                raise TopologyError(f"{where}.{end}: {entry.get(end)!r} is not a declared rank")
            ends.append(index[entry[end]])
        if "bandwidth" not in entry:
            raise TopologyError(f"{where}.bandwidth: missing")
        media = entry.get("media", [])
        if not isinstance(media, list) or not all(isinstance(m, str) for m in media):
            raise TopologyError(f"{where}.media: must be a list of medium names, got {media!r}")
        bidirectional = entry.get("bidirectional", False)
        if not isinstance(bidirectional, bool):
            raise TopologyError(f"{where}.bidirectional: must be true or false, got {bidirectional!r}")
        attributes = {k: entry[k] for k in ("bandwidth", "latency", "loss", "cost") if k in entry}
        link = Link(ends[0], ends[1], media=tuple(media), **attributes)
        _check_link(where, link)
        names = {i: name for name, i in index.items()}
        for made in (link, replace(link, src=link.dst, dst=link.src))[: 2 if bidirectional else 1]:
            if any((other.src, other.dst) == (made.src, made.dst) for other in links):
                raise TopologyError(f"{where}: a second link from {names[made.src]} to {names[made.dst]}")
            links.append(made)
    return links


def _table(document: Mapping[str, Any], key: str, allowed: set[str]) -> list[dict[str, Any]]:
    entries = document.get(key, [])
    if not isinstance(entries, list):
        raise TopologyError(f"{key}: must be a list of tables, got {type(entries).__name__}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise TopologyError(f"{key}[{i}]: must be a table, got {entry!r}")
        unknown = set(entry) - allowed
        if unknown:
            raise TopologyError(f"{key}[{i}]: unknown field(s) {sorted(unknown)}; allowed {sorted(allowed)}")
    return entries


def load(path: str | Path) -> Topology:
    """Read a topology file: ``.toml`` as TOML, anything else as JSON."""
    path = Path(path)
    text = path.read_text()
    try:
        document = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
        raise TopologyError(
            f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {error}"
        ) from None
    if not isinstance(document, dict):
        raise TopologyError(f"{path}: the document must be a table")
    return from_dict(document)


def dump(topology: Topology, path: str | Path) -> None:
    """Write a topology as JSON (``load`` reads it back to an equal topology)."""
    Path(path).write_text(json.dumps(topology.to_dict(), indent=1) + "\n")
