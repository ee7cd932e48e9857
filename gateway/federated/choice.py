"""Upload raw data, or train locally and upload model updates: a pure choice per gateway and service.

Rules, in order (the first that applies decides; the reason names it):
1. ``private`` service: always train locally (raw data may not leave the gateway).
2. The gateway cannot train (``edge_can_train`` False): upload raw.
3. Link ``down``, or ``flapping`` with ``up_fraction`` below ``min_up_fraction``: train locally (an
   update is a few kB that the log keeps until the link returns; raw data would pile up).
4. Raw data would need more than ``max_link_share`` of the link's usable goodput
   (goodput x up_fraction when flapping): train locally.
5. Otherwise upload raw: centralised training on all data is at least as accurate and costs the
   gateway no CPU.

Invariant: pure: the same inputs always give the same ``TrainingChoice``; no I/O, no state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.placement.cost import LinkState

Mode = Literal["upload_raw", "train_locally"]


class LinkLike(Protocol):
    """What the choice reads of gateway.placement.cost.LinkView (read-only: LinkView is frozen)."""

    @property
    def state(self) -> LinkState: ...

    @property
    def goodput_Bps(self) -> float: ...

    @property
    def up_fraction(self) -> float: ...


@dataclass(frozen=True)
class TrainingChoice:
    mode: Mode
    reason: str

    def __str__(self) -> str:
        return f"{self.mode}: {self.reason}"


def choose_training_mode(
    link: LinkLike,
    private: bool,
    *,
    raw_Bps: float,
    edge_can_train: bool = True,
    max_link_share: float = 0.5,
    min_up_fraction: float = 0.5,
) -> TrainingChoice:
    """``raw_Bps``: the bytes per second the service's raw samples would add to the uplink."""
    if private:
        return TrainingChoice("train_locally", "private service: raw data stays on the gateway")
    if not edge_can_train:
        return TrainingChoice("upload_raw", "the gateway cannot train (no CPU budget for it)")
    if link.state == "down":
        return TrainingChoice("train_locally", "link down: updates wait in the log, raw data would pile up")
    up = min(max(link.up_fraction, 0.0), 1.0) if link.state == "flapping" else 1.0
    if link.state == "flapping" and up < min_up_fraction:
        return TrainingChoice("train_locally", f"link flapping, up {up:.0%} < {min_up_fraction:.0%}")
    usable = link.goodput_Bps * up * max_link_share
    if raw_Bps > usable:
        return TrainingChoice(
            "train_locally",
            f"raw {raw_Bps:.0f} B/s > {max_link_share:.0%} of usable goodput ({usable:.0f} B/s)",
        )
    return TrainingChoice("upload_raw", f"raw {raw_Bps:.0f} B/s fits the link ({usable:.0f} B/s usable)")
