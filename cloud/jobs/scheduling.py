"""SchedulerSettings: how cloudd schedules its training jobs (the nodes it runs them on and the
``cloud.scheduler`` modules it composes), from flags or a ``[scheduler]`` TOML file.

    [scheduler]
    policy = "las"               # cloud.scheduler.policies: fifo, las, ...
    placement = "consolidated"   # consolidated, first_fit
    admission = "accept_all"     # accept_all, load_based, user_quota
    round_interval_s = 1.0       # a round also runs on every submission and every run's end
    min_run_s = 30.0             # a run's lease term: seconds of training (from its first step) before
                                 # a preemption is carried out
    [scheduler.policy_options]   # optional: keyword arguments of the policy's class
    [scheduler.admission_options]
    [[scheduler.nodes]]
    name = "local"
    devices = 4
    generation = "cpu"

``--nodes local:4:cpu,big:8:h100`` gives the nodes on the command line. The default is one node
``local`` with ``--max-job-nproc`` devices of generation ``cpu`` under FIFO: with
``--max-running-jobs 1`` that is cloudd's first-come, first-served queue.

Invariant: settings that ``scheduler_settings`` returns compose (every name is in its registry,
every node valid); anything else is a ``ConfigError`` naming the flag or the file and field.
A pure module: cloudd imports it and no torch.
"""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud.scheduler.cluster import Node
from cloud.scheduler.round import Scheduler

DEFAULT_GENERATION = "cpu"


class SchedulerConfigError(ValueError):
    """Invalid scheduler settings; the message names the flag or the file and field."""


@dataclass(frozen=True)
class SchedulerSettings:
    nodes: tuple[Node, ...]
    policy: str = "fifo"
    placement: str = "consolidated"
    admission: str = "accept_all"
    round_interval_s: float = 1.0
    min_run_s: float = 30.0
    policy_options: dict[str, Any] = field(default_factory=dict)
    admission_options: dict[str, Any] = field(default_factory=dict)

    def scheduler(self) -> Scheduler:
        return Scheduler.from_names(
            policy=self.policy,
            placement=self.placement,
            admission=self.admission,
            policy_options=self.policy_options,
            admission_options=self.admission_options,
        )

    @property
    def devices(self) -> int:
        return sum(n.devices for n in self.nodes)

    def describe(self) -> dict[str, Any]:
        """What /v1/jobs shows of the scheduler."""
        return {
            "policy": self.policy,
            "placement": self.placement,
            "admission": self.admission,
            "round_interval_s": self.round_interval_s,
            "min_run_s": self.min_run_s,
            "nodes": [{"name": n.name, "devices": n.devices, "generation": n.generation} for n in self.nodes],
        }


def parse_nodes(text: str) -> tuple[Node, ...]:
    """``name:devices:generation,...`` (generation optional: cpu)."""
    nodes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or not parts[1].isdigit():
            raise SchedulerConfigError(f"--nodes {item!r}: expected NAME:DEVICES[:GENERATION]")
        try:
            nodes.append(Node(parts[0], int(parts[1]), parts[2] if len(parts) == 3 else DEFAULT_GENERATION))
        except ValueError as exc:
            raise SchedulerConfigError(f"--nodes {item!r}: {exc}") from None
    if not nodes:
        raise SchedulerConfigError("--nodes: no node given")
    return tuple(nodes)


def _file_settings(path: Path) -> dict[str, Any]:
    try:
        table = tomllib.loads(path.read_text()).get("scheduler")
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SchedulerConfigError(f"--scheduler-config {path}: {exc}") from None
    if not isinstance(table, dict):
        raise SchedulerConfigError(f"--scheduler-config {path}: missing [scheduler] table")
    known = {"policy", "placement", "admission", "round_interval_s", "min_run_s"}
    known |= {"policy_options", "admission_options"}
    unknown = set(table) - known - {"nodes"}
    if unknown:
        raise SchedulerConfigError(
            f"--scheduler-config {path}: scheduler.{sorted(unknown)[0]}: unknown field"
        )
    settings = {k: v for k, v in table.items() if k in known}
    if "nodes" in table:
        nodes = []
        for i, node in enumerate(table["nodes"] if isinstance(table["nodes"], list) else [None]):
            where = f"--scheduler-config {path}: scheduler.nodes[{i}]"
            if not isinstance(node, dict) or set(node) - {"name", "devices", "generation"}:
                raise SchedulerConfigError(f"{where}: expected a table of name, devices, generation")
            try:
                nodes.append(
                    Node(
                        str(node.get("name", "")),
                        int(node.get("devices", 0)),
                        str(node.get("generation", DEFAULT_GENERATION)),
                    )
                )
            except (TypeError, ValueError) as exc:
                raise SchedulerConfigError(f"{where}: {exc}") from None
        settings["nodes"] = tuple(nodes)
    return settings


def scheduler_settings(
    *,
    default_devices: int,
    config_file: Path | None = None,
    nodes: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> SchedulerSettings:
    """The file's settings, then the flags' (``nodes``, ``overrides``: those given), over the defaults."""
    chosen: dict[str, Any] = _file_settings(config_file) if config_file else {}
    if nodes:
        chosen["nodes"] = parse_nodes(nodes)
    chosen.update({k: v for k, v in (overrides or {}).items() if v is not None})
    chosen.setdefault("nodes", (Node("local", max(1, default_devices), DEFAULT_GENERATION),))
    for name, bound in (("round_interval_s", 0.0), ("min_run_s", -1.0)):
        value = chosen.get(name, 1.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > bound:
            raise SchedulerConfigError(f"scheduler.{name}: {value!r}; must be a number > {bound:g}")
    for name in ("policy_options", "admission_options"):
        if not isinstance(chosen.get(name, {}), dict):
            raise SchedulerConfigError(f"scheduler.{name}: must be a table")
    try:
        settings = SchedulerSettings(**chosen)
        settings.scheduler()  # every name known, every option accepted
    except (TypeError, ValueError) as exc:
        raise SchedulerConfigError(str(exc)) from None
    return settings


def add_scheduler_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("job scheduler (docs/training.md, 'Running cloudd with a scheduler')")
    group.add_argument("--scheduler-config", type=Path, help="TOML file with a [scheduler] table")
    group.add_argument("--nodes", help="NAME:DEVICES[:GENERATION],... (default local:<max-job-nproc>:cpu)")
    group.add_argument("--scheduler-policy", help="fifo (default), las, ... (cloud.scheduler.policies)")
    group.add_argument("--scheduler-placement", help="consolidated (default), first_fit")
    group.add_argument("--scheduler-admission", help="accept_all (default), load_based, user_quota")
    group.add_argument("--scheduler-round-interval", type=float, help="seconds between rounds (default 1)")
    group.add_argument(
        "--scheduler-min-run", type=float, help="seconds a run trains before it may be preempted (default 30)"
    )


def scheduler_from_args(args: argparse.Namespace) -> SchedulerSettings:
    return scheduler_settings(
        default_devices=args.max_job_nproc,
        config_file=args.scheduler_config,
        nodes=args.nodes,
        overrides={
            "policy": args.scheduler_policy,
            "placement": args.scheduler_placement,
            "admission": args.scheduler_admission,
            "round_interval_s": args.scheduler_round_interval,
            "min_run_s": args.scheduler_min_run,
        },
    )
