"""Tell each gateway, after a lifecycle change of a model name, which version of it to run.

Invariant: a gateway is told only its assignment (``transitions.assignment``: canary, production or
the factory version), so a candidate that no alias names is never announced to anyone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cloud.registry import ModelRegistry
from cloud.rollout.transitions import assignment
from protocol.events import ModelMetadata


def announce_assignments(
    registry: ModelRegistry,
    name: str,
    gateways: Iterable[str],
    tell: Callable[[str, ModelMetadata], None],
) -> None:
    state, factory = registry.lifecycle(name), registry.factory_version(name)
    for gateway in sorted(gateways):
        assigned = assignment(state, gateway, factory)
        if assigned is not None:
            tell(gateway, registry.metadata(name, assigned[0]))
