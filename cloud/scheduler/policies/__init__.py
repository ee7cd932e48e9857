"""Scheduling policies: one file each, and the registry that names them.

A new policy is a ``Policy`` subclass in its own file plus one entry in ``POLICIES``
(docs/scheduler.md, "Writing a policy").
"""

from __future__ import annotations

from cloud.scheduler.policies.base import Policy, Rank
from cloud.scheduler.policies.fifo import Fifo
from cloud.scheduler.policies.hetero import Hetero
from cloud.scheduler.policies.las import Las
from cloud.scheduler.policies.srtf import Srtf
from cloud.scheduler.policies.tiresias import Tiresias

POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (Fifo, Las, Srtf, Tiresias, Hetero)}

__all__ = ["POLICIES", "Policy", "Rank"]
