"""The ``Aggregator`` interface and one class per strategy (policy only; ``coordinator.py`` drives).

The coordinator offers each decoded update to ``admit`` (which may turn it into a failure), asks
``ready`` after every poll, and calls ``aggregate`` with the buffered results and the failures seen
since the last aggregation. Failures are values: a gateway that vanished simply sent nothing, a
stale or duplicate update is a ``Failure``; no strategy raises for a bad client.

    fedavg   synchronous rounds (McMahan et al., AISTATS'17): only updates trained on the current
             version count, one per gateway; a round closes at ``min_updates`` or, with at least
             one update, after ``round_timeout_s`` (so a vanished gateway delays, never blocks).
    fedprox  fedavg's server with the proximal term mu on the gateways (Li et al., MLSys'20).
    fedbuff  buffered asynchronous aggregation (Nguyen et al., AISTATS'22): any update at most
             ``max_staleness`` versions old enters the buffer; aggregate once K arrived, each
             weighted by samples x 1/sqrt(1 + staleness).

Invariant: ``aggregate`` returns None (keep the global model) only when ``results`` is empty.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch

from cloud.federated import aggregate as math_
from protocol.federated import AggregatorName, FederatedJob, RoundConfig

# Why a strategy turned an update away (a counter label in GET /v1/federated/status).
FailureReason = Literal["stale", "second_in_round", "future_base"]


@dataclass(frozen=True)
class ClientUpdate:
    gateway: str
    update_id: str
    base_version: int
    samples: int
    delta: torch.Tensor = field(repr=False)
    payload_bytes: int = 0


@dataclass(frozen=True)
class Failure:
    gateway: str
    update_id: str
    reason: FailureReason
    detail: str = ""


@dataclass(frozen=True)
class AggregateResult:
    step: torch.Tensor = field(
        repr=False
    )  # added to the global weights (times server_lr); values at state coordinates
    gateways: tuple[str, ...]
    staleness: tuple[int, ...]
    weights: tuple[float, ...]
    clipped: int
    failures: int


class Aggregator(ABC):
    name: ClassVar[AggregatorName]

    def __init__(self, job: FederatedJob) -> None:
        self.job = job

    def round_config(self) -> RoundConfig:
        """What gateways train with; sent with every global model."""
        return self.job.round

    @abstractmethod
    def admit(self, update: ClientUpdate, version: int, buffered: Sequence[ClientUpdate]) -> Failure | None:
        """None: the update joins the buffer. A Failure: it is dropped (and counted) instead."""

    @abstractmethod
    def ready(self, buffered: Sequence[ClientUpdate], version: int, round_age_s: float) -> bool:
        """Whether to aggregate now (``round_age_s``: time since the current version appeared)."""

    def weight(self, update: ClientUpdate, version: int) -> float:
        return float(update.samples)

    def aggregate(
        self,
        results: Sequence[ClientUpdate],
        failures: Sequence[Failure],
        version: int,
        state: torch.Tensor | None = None,
    ) -> AggregateResult | None:
        """Combine ``results`` into one server step; None (the global model is kept) if there are
        none. ``state`` marks value coordinates (buffers): averaged the same way, never clipped."""
        if not results:
            return None
        clipped, deltas = 0, []
        for update in results:
            delta, was_clipped = math_.clip_by_norm(update.delta, self.job.clip_norm, state)
            deltas.append(delta)
            clipped += was_clipped
        weights = [self.weight(u, version) for u in results]
        if self.job.robust == "median":
            step = math_.coordinate_median(deltas)
        elif self.job.robust == "trimmed_mean":
            step = math_.trimmed_mean(deltas, self.job.trim_fraction)
        else:
            step = math_.weighted_mean(deltas, weights)
        return AggregateResult(
            step,
            tuple(u.gateway for u in results),
            tuple(version - u.base_version for u in results),
            tuple(weights),
            clipped,
            len(failures),
        )


class FedAvg(Aggregator):
    name: ClassVar[AggregatorName] = "fedavg"

    def admit(self, update: ClientUpdate, version: int, buffered: Sequence[ClientUpdate]) -> Failure | None:
        if update.base_version != version:
            return Failure(
                update.gateway,
                update.update_id,
                "stale",
                f"trained on version {update.base_version}, round is on {version}",
            )
        if any(b.gateway == update.gateway for b in buffered):
            return Failure(
                update.gateway,
                update.update_id,
                "second_in_round",
                f"{update.gateway} already has an update in round {version}",
            )
        return None

    def ready(self, buffered: Sequence[ClientUpdate], version: int, round_age_s: float) -> bool:
        timed_out = bool(buffered) and round_age_s >= self.job.round_timeout_s
        return len(buffered) >= self.job.min_updates or timed_out


class FedProx(FedAvg):
    name: ClassVar[AggregatorName] = "fedprox"
    DEFAULT_MU = 0.01

    def round_config(self) -> RoundConfig:
        if self.job.round.mu > 0:
            return self.job.round
        return self.job.round.model_copy(update={"mu": self.DEFAULT_MU})


class FedBuff(Aggregator):
    name: ClassVar[AggregatorName] = "fedbuff"

    def admit(self, update: ClientUpdate, version: int, buffered: Sequence[ClientUpdate]) -> Failure | None:
        staleness = version - update.base_version
        if staleness < 0:
            return Failure(
                update.gateway,
                update.update_id,
                "future_base",
                f"base version {update.base_version} > current {version}",
            )
        if staleness > self.job.max_staleness:
            return Failure(
                update.gateway,
                update.update_id,
                "stale",
                f"staleness {staleness} > max_staleness {self.job.max_staleness}",
            )
        return None

    def ready(self, buffered: Sequence[ClientUpdate], version: int, round_age_s: float) -> bool:
        return len(buffered) >= self.job.buffer_k

    def weight(self, update: ClientUpdate, version: int) -> float:
        return update.samples * math_.staleness_discount(version - update.base_version)


AGGREGATORS: dict[AggregatorName, type[Aggregator]] = {cls.name: cls for cls in (FedAvg, FedProx, FedBuff)}


def make_aggregator(job: FederatedJob) -> Aggregator:
    try:
        return AGGREGATORS[job.aggregator](job)
    except KeyError:
        raise ValueError(f"unknown aggregator {job.aggregator!r}; valid: {sorted(AGGREGATORS)}") from None
