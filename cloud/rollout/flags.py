"""cloudd's flags of the quality gate and the rollout controller (defaults: ``GateConfig``,
``RolloutConfig``). Invariant: every ``RolloutConfig`` field has one flag, named after it."""

from __future__ import annotations

import argparse
from dataclasses import fields

from cloud.rollout.health import RolloutConfig
from cloud.rollout.verdict import GateConfig

HELP = {
    "interval_s": "seconds between the rollout controller's looks at the canaries",
    "canary_soak_s": "seconds a healthy canary runs before it becomes production",
    "auto_promote": "promote a healthy canary after the soak (else wait for the operator)",
    "min_frames_to_judge": "canary frames before the controller judges it at all",
    "min_frames_to_promote": "canary frames before it may become production",
    "max_confidence_drop": "roll back when the canary's confidence shift from the baseline falls "
    "this far below the one its gate evaluation measured (no evaluation: below 0)",
    "min_shadow_agreement": "without a gate figure: roll back when agreement with the previous "
    "version is below this",
    "max_agreement_drop": "roll back when shadow agreement falls this far below the agreement "
    "its gate evaluation measured with the same production",
    "min_shadow_frames": "shadow frames before shadow agreement counts",
    "max_error_rate": "roll back when the canary's error rate is above this",
}


def add_rollout_arguments(parser: argparse.ArgumentParser) -> None:
    gate = GateConfig()
    parser.add_argument(
        "--gate-tolerance",
        type=float,
        default=gate.tolerance,
        help="a new version ties the one it replaces within this (accuracy points; loss: relative)",
    )
    parser.add_argument(
        "--gate-floor-over-chance",
        type=float,
        default=gate.floor_over_chance,
        help="with nothing to replace, accuracy must beat chance by this",
    )
    defaults = RolloutConfig()
    for field in fields(RolloutConfig):
        flag = "--rollout-" + field.name.replace("_", "-")
        default = getattr(defaults, field.name)
        if isinstance(default, bool):
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=HELP[field.name]
            )
        else:
            parser.add_argument(flag, type=type(default), default=default, help=HELP[field.name])


def rollout_config(args: argparse.Namespace) -> RolloutConfig:
    return RolloutConfig(**{f.name: getattr(args, "rollout_" + f.name) for f in fields(RolloutConfig)})
