"""The trainer's optional features as data: one validated section each, shared by the job TOML
(``cloud.training.jobfile``) and the job spec users submit (``cloud.jobs.spec``).

A pure module (pydantic only, no torch): cloudd validates a submitted spec with these very classes,
so a spec that cloudd accepts is a job file the trainer accepts, field for field.

Invariant: each section's defaults mean "off" (the trainer runs exactly as without the section);
every bound is checked here, and a ``ValidationError`` names the field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

ActivationMode = Literal["none", "bfp", "adaptive"]
Precision = Literal["fp32", "bf16"]  # bf16: autocast where the rank's device supports it
DeviceChoice = Literal["auto", "cpu", "cuda"]  # auto: CUDA with NCCL when present, else CPU with gloo
DEFAULT_BFP_FORMAT = "bfp(b=32,m=4,e=8,r=nearest,l=uniform,o=0.0)"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ControllerOptions(_Section):
    """The adaptive controller's knobs (``compression.controller.ControllerSettings``; its window is
    ``CompressionOptions.window``). Rungs index the format ladder, 0 = loosest (m8)."""

    start_rung: int = Field(default=0, ge=0)
    tightest_rung: int = Field(default=3, ge=0)
    tighten_rungs: int = Field(default=3, ge=1)
    act_tighten_below: float = Field(default=0.2, gt=0)
    act_loosen_above: float = Field(default=0.35, gt=0)
    grad_tighten_below: float = Field(default=0.15, gt=0)
    grad_loosen_above: float = Field(default=0.3, gt=0)
    loss_rise_tolerance: float = Field(default=0.1, ge=0)


class CompressionOptions(_Section):
    """Activations saved for backward, stored compressed on every stage (docs/compression.md).
    ``activations``: none, one fixed BFP ``format`` for every layer, or ``adaptive`` (the controller
    picks per layer every ``window`` steps). ``gist``: the Gist encodings (binarized ReLU->MaxPool,
    sparse ReLU->conv), on their own or with either BFP mode."""

    activations: ActivationMode = "none"
    format: str = DEFAULT_BFP_FORMAT  # "bfp": every layer's format
    gist: bool = False
    window: int = Field(default=20, ge=1)  # "adaptive": steps per decision
    min_numel: int | None = Field(default=None, ge=0)  # smaller groups stay as they are; None: measured
    controller: ControllerOptions = ControllerOptions()


Collective = Literal["torch", "ring", "trees", "double_tree"]


class SyncOptions(_Section):
    """The barrier sync scheduler (``sync.scheduler.SyncScheduler``) for the gradient all-reduce of
    replicated stages; off: one plain all-reduce per parameter after the flush. ``collective``:
    what sums the gradients (the scheduler's messages, or the plain all-reduce): torch.distributed's
    all-reduce, or a program of ``cloud.training.collectives`` over point-to-point messages (a
    ring, NCCL's double binary tree, or Blink's trees packed into the fabric of the ``topology``
    file; empty: every pair of ranks alike)."""

    enabled: bool = False
    window: int = Field(default=8, ge=1)  # iterations per policy decision
    adaptive: bool = True  # False: per-layer FIFO sync, no policy engine
    collective: Collective = "torch"
    topology: str = ""  # path of a topology file (docs/collectives.md) of the job's ranks


class BalanceOptions(_Section):
    """Rank balancing (``sync.balancer.Balancer``): the replicas of a replicated stage get shares of
    each minibatch's samples by measured speed, gradients weighted by share."""

    enabled: bool = False
    every: int = Field(default=2, ge=1)  # iterations between re-splits
    alpha: float = Field(default=0.5, gt=0, le=1)  # EWMA weight of the newest speed
    hysteresis: float = Field(default=0.08, ge=0)  # predicted imbalance below which nothing moves
    # the first split, one relative speed per replica (e.g. [3, 1]); empty: equal shares
    declared_speeds: list[Annotated[float, Field(gt=0)]] = []


class ToggleOptions(_Section):
    """Toggle-rate selection (``data.sampler.ToggleSampler``): after ``warmup_epochs`` over every
    item, each epoch trains on ``fraction`` of the items, the unsettled ones first."""

    enabled: bool = False
    fraction: float = Field(default=0.5, gt=0, le=1)
    floor: float = Field(default=0.1, gt=0, le=1)  # share of settled items still drawn at random
    warmup_epochs: int = Field(default=1, ge=0)
