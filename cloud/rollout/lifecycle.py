"""A model name's lifecycle: each version's stage, the production and canary aliases, and the events
of every decision, in ``DATA_DIR/models/<name>/lifecycle.json``.

Stages: ``candidate`` (stored, runs nowhere), ``canary`` (runs on the canary set), ``production``
(runs everywhere else), ``archived`` (runs nowhere; rolled back or replaced). At most one version of
a name is ``production`` and at most one ``canary``; the aliases name exactly those versions.

Migration of a data dir from before stages: a name without ``lifecycle.json`` gets one on first
read, with its highest-seq central version as ``production`` (what gateways followed until then:
nothing they run changes) and every other version ``candidate``.

Invariants: the file is replaced atomically after each change, under the owner's lock, so a reader
sees a whole state; ``events`` keeps the newest ``MAX_EVENTS`` (``events_total`` counts all, so
how many were dropped is known); a version absent from ``stages`` is a ``candidate``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from runtime.files import atomic_write

Stage = Literal["candidate", "canary", "production", "archived"]
STAGES: tuple[str, ...] = get_args(Stage)
LIFECYCLE_FILE = "lifecycle.json"
MAX_EVENTS = 200


@dataclass
class Canary:
    """The canary version and who runs it: the gateways named, else a share of the fleet."""

    version: str
    gateways: list[str]
    share: float | None
    started_ts: float


@dataclass
class Lifecycle:
    production: str | None = None
    canary: Canary | None = None
    stages: dict[str, Stage] = field(default_factory=dict)
    previous: list[str] = field(default_factory=list)  # earlier productions, oldest first (bounded)
    events: list[dict[str, Any]] = field(default_factory=list)
    events_total: int = 0

    def stage(self, version: str) -> Stage:
        return self.stages.get(version, "candidate")

    def record(self, event: dict[str, Any]) -> None:
        self.events = [*self.events, event][-MAX_EVENTS:]
        self.events_total += 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Lifecycle:
        canary = data.get("canary")
        return cls(
            production=data.get("production"),
            canary=Canary(**canary) if canary else None,
            stages=dict(data.get("stages", {})),
            previous=list(data.get("previous", [])),
            events=list(data.get("events", [])),
            events_total=int(data.get("events_total", 0)),
        )


def read_lifecycle(folder: Path, central_versions_by_seq: list[str]) -> Lifecycle:
    """The name's lifecycle in ``folder``; migrated (see the module doc) when the file is absent."""
    path = folder / LIFECYCLE_FILE
    if path.exists():
        return Lifecycle.from_json(json.loads(path.read_text()))
    state = Lifecycle()
    if central_versions_by_seq:
        latest = central_versions_by_seq[-1]
        state.production = latest
        state.stages[latest] = "production"
        state.record({"ts": 0.0, "action": "migrated", "version": latest, "reason": "latest before stages"})
    return state


def write_lifecycle(folder: Path, state: Lifecycle) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / LIFECYCLE_FILE, json.dumps(state.to_json(), indent=1).encode())
