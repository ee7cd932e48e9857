"""Admission: which submitted jobs the policy may consider, one class per rule, and their registry.

A job waits for admission until a round accepts it; after that it is admitted for good. A verdict
either accepts, holds (the job stays queued and is asked again next round, with the reason shown in
its queue entry) or refuses for good (``final``: the job can never be admitted, e.g. its demand is
over its user's quota; the backend marks it refused with the reason).

    accept_all  every job
    load_based  while the admitted active demand stays within ``max_load`` x the cluster's devices
    user_quota  while the user's admitted active jobs hold at most ``max_devices`` devices (refused
                outright when one job alone asks for more)

Invariant: a verdict that does not accept carries a non-empty reason.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from cloud.scheduler.cluster import ClusterState
from cloud.scheduler.jobs import JobState


@dataclass(frozen=True)
class Verdict:
    accept: bool
    reason: str = ""
    final: bool = False  # a refusal for good (only when not accepted)

    def __post_init__(self) -> None:
        if not self.accept and not self.reason:
            raise ValueError("verdict.reason: a hold or refusal must say why")


ACCEPT = Verdict(True)


class Admission(ABC):
    name: ClassVar[str]

    @abstractmethod
    def admit(self, job: JobState, admitted: Sequence[JobState], cluster: ClusterState) -> Verdict:
        """``admitted``: the active jobs admitted so far (this round's acceptances included)."""


class AcceptAll(Admission):
    name: ClassVar[str] = "accept_all"

    def admit(self, job: JobState, admitted: Sequence[JobState], cluster: ClusterState) -> Verdict:
        return ACCEPT


class LoadBased(Admission):
    name: ClassVar[str] = "load_based"

    def __init__(self, max_load: float = 2.0) -> None:
        if not max_load > 0:
            raise ValueError(f"admission.max_load: {max_load}; must be > 0")
        self.max_load = max_load

    def admit(self, job: JobState, admitted: Sequence[JobState], cluster: ClusterState) -> Verdict:
        demand = sum(j.devices for j in admitted) + job.devices
        load = demand / cluster.capacity()
        if load <= self.max_load:
            return ACCEPT
        return Verdict(False, f"load_based: load would be {load:.2f} > max_load {self.max_load:g}")


class UserQuota(Admission):
    name: ClassVar[str] = "user_quota"

    def __init__(self, max_devices: int = 8, per_user: Mapping[str, int] | None = None) -> None:
        for who, quota in {"*": max_devices, **(per_user or {})}.items():
            if quota < 1:
                raise ValueError(f"admission.max_devices[{who!r}]: {quota}; must be >= 1")
        self.max_devices = max_devices
        self.per_user = dict(per_user or {})

    def quota(self, user: str) -> int:
        return self.per_user.get(user, self.max_devices)

    def admit(self, job: JobState, admitted: Sequence[JobState], cluster: ClusterState) -> Verdict:
        quota = self.quota(job.user)
        if job.devices > quota:
            reason = f"user_quota: job asks {job.devices} devices, user {job.user!r} may hold {quota}"
            return Verdict(False, reason, final=True)
        held = sum(j.devices for j in admitted if j.user == job.user)
        if held + job.devices <= quota:
            return ACCEPT
        return Verdict(False, f"user_quota: user {job.user!r} holds {held} of {quota} devices")


ADMISSIONS: dict[str, type[Admission]] = {cls.name: cls for cls in (AcceptAll, LoadBased, UserQuota)}
