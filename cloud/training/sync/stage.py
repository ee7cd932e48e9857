"""The data-parallel mechanisms on a pipeline's replicated stages (the ``[sync]`` and ``[balance]``
job sections).

``StageSync``: a replicated stage's gradient sum goes through a ``SyncScheduler`` on the stage's
replica group instead of the executor's per-parameter all-reduce. The stage runs one backward per
microbatch, so the scheduler's backward hooks stay off: the executor hands it the accumulated
gradients once, at the flush (``hand_off``), and the scheduler steps each layer before the layer's
next forward (the next step's, an evaluation's, or ``finish`` before weights are read).

``StageBalance``: the replicas of the one replicated stage share each minibatch's *samples* by
measured speed. The schedule fixes which microbatches a replica runs (microbatch b on replica
b mod r), so a share cannot move whole microbatches without another schedule; instead every
microbatch of replica j carries an equal part of ``sizes[j]`` samples, and each microbatch's loss
is scaled by its samples / the minibatch's (``StageExecutor.run_step(batch_samples=...)``). The
replicas' summed gradient is then the minibatch's mean gradient whatever the split: each replica's
local mean weighted by its share, as ``Balancer`` prescribes. Every rank must cut the minibatch the
same way, so the stage's first rank broadcasts the sizes to the whole job at each re-split check.

Invariant: every rank holds the same ``microbatch_sizes()`` at every step, summing to the batch size,
each at least 1; with sync on, each gradient is summed across the replicas once per step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from cloud.training.jobfile import JobError
from cloud.training.options import BalanceOptions, SyncOptions
from cloud.training.schedules import Topology
from cloud.training.sync.balancer import Balancer
from cloud.training.sync.link import Reducer
from cloud.training.sync.scheduler import SyncScheduler
from cloud.training.sync.split import split_batch


def replicated_stages(topology: Topology) -> list[int]:
    return [s for s, count in enumerate(topology.replicas) if count > 1]


class StageSync:
    """Every rank constructs it (the scheduler's priority groups are collectives of the whole job);
    ``scheduler`` is None on a rank whose stage is not replicated or has no parameters."""

    def __init__(
        self,
        options: SyncOptions,
        module: nn.Module,
        topology: Topology,
        rank: int,
        *,
        lr: float,
        momentum: float,
        timeout_s: float,
        reducer_for: Callable[[dist.ProcessGroup | None], Reducer] | None = None,
    ) -> None:
        stage, _ = topology.stage_replica_of(rank)
        # The scheduler's comm threads get groups of their own (two lanes): a collective of the
        # stage's replica group (the balancer's) in the main thread must not interleave with theirs.
        # dist.new_group is a collective of the default group: every rank creates every one, in order.
        lanes = {
            s: (dist.new_group(ranks, backend="gloo"), dist.new_group(ranks, backend="gloo"))
            for s in replicated_stages(topology)
            for ranks in [topology.stage_ranks(s)]
        }
        self.scheduler: SyncScheduler | None = None
        self._reported_blocked_s = self._stepped_blocked_s = 0.0
        params = list(module.parameters())
        if stage not in lanes or not params:
            return
        if params[0].device.type != "cpu":
            raise JobError(
                "sync.enabled: the sync scheduler sums CPU tensors (gloo); "
                f"this stage is on {params[0].device}"
            )
        self.scheduler = SyncScheduler(
            module,
            lambda layer_params: torch.optim.SGD(layer_params, lr=lr, momentum=momentum),
            group=lanes[stage][0],
            window=options.window,
            adaptive=options.adaptive,
            priority_group=lanes[stage][1],
            timeout_s=timeout_s,
            backward_hooks=False,
            reducer_for=reducer_for,
        )
        # The executor scales each microbatch's loss by its share of the minibatch: a plain sum.
        self.scheduler.set_sample_weight(1.0)

    def step_blocked_s(self) -> float:
        """Seconds this rank's forwards waited for syncs since the last call (not compute)."""
        if self.scheduler is None:
            return 0.0
        blocked = self.scheduler.blocked_s - self._stepped_blocked_s
        self._stepped_blocked_s = self.scheduler.blocked_s
        return blocked

    def finish(self) -> None:
        if self.scheduler is not None:
            self.scheduler.finish()

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()

    def optimizer_state(self) -> dict:
        assert self.scheduler is not None
        return {layer: optimizer.state_dict() for layer, optimizer in self.scheduler.optimizers.items()}

    def load_optimizer_state(self, state: dict) -> None:
        assert self.scheduler is not None
        for layer, optimizer in self.scheduler.optimizers.items():
            optimizer.load_state_dict(state[layer])

    def report(self) -> dict | None:
        """Live figures since the previous report (None on a rank without a scheduler)."""
        if self.scheduler is None:
            return None
        status = self.scheduler.status()
        blocked = self.scheduler.blocked_s - self._reported_blocked_s
        self._reported_blocked_s = self.scheduler.blocked_s
        return {
            "policy": status["policy"],
            "iteration": status["iteration"],
            "windows": status["window"],
            "decisions": len(status["decisions"]),
            "blocked_s": round(blocked, 4),
            "reducer_runs": status["reducer_runs"],  # syncs summed by a sync.collective program
        }


class StageBalance:
    """Every rank constructs it and calls ``end_step`` after each step; ``balancer`` is None outside
    the balanced stage."""

    def __init__(
        self,
        options: BalanceOptions,
        topology: Topology,
        rank: int,
        replica_groups: Sequence[dist.ProcessGroup],
        *,
        microbatches: int,
        batch_size: int,
    ) -> None:
        replicated = replicated_stages(topology)
        if len(replicated) != 1:
            raise JobError(
                "balance.enabled: balancing splits each minibatch between the replicas of one stage; "
                f"the plan replicates {len(replicated)} stages"
            )
        self.stage = replicated[0]
        replicas = topology.replicas[self.stage]
        if options.declared_speeds and len(options.declared_speeds) != replicas:
            raise JobError(
                f"balance.declared_speeds: one speed per replica of stage {self.stage} ({replicas})"
            )
        self.every, self.batch_size = options.every, batch_size
        self.source = topology.stage_ranks(self.stage)[0]
        self.mine = [
            [b for b in range(microbatches) if topology.replica_for(self.stage, b) == j]
            for j in range(replicas)
        ]
        if not all(self.mine):
            raise JobError(
                f"balance.enabled: stage {self.stage}'s {replicas} replicas need train.microbatches >= "
                f"{replicas} (one microbatch each at least), got {microbatches}"
            )
        least = max(len(m) for m in self.mine)  # one sample per microbatch at least
        speeds = options.declared_speeds or [1.0] * replicas
        self.sizes: tuple[int, ...] = split_batch(speeds, batch_size, least)
        self.balancer: Balancer | None = None
        self.replica: int | None = None
        if rank in topology.stage_ranks(self.stage):
            self.replica = topology.stage_replica_of(rank)[1]
            self.balancer = Balancer(
                batch_size,
                group=replica_groups[self.stage],
                declared_speeds=speeds,
                alpha=options.alpha,
                hysteresis=options.hysteresis,
                every=options.every,
                min_per_rank=least,
            )
        self.steps = 0

    def microbatch_sizes(self) -> list[int]:
        sizes = [0] * sum(len(m) for m in self.mine)
        for share, microbatches in zip(self.sizes, self.mine, strict=True):
            base, extra = divmod(share, len(microbatches))
            for i, b in enumerate(microbatches):
                sizes[b] = base + (1 if i < extra else 0)
        return sizes

    def end_step(self, compute_s: float) -> None:
        """Every rank, after each step: the balanced stage's replicas time it (compute only) and
        maybe re-split; at each check the new sizes reach every rank."""
        self.steps += 1
        if self.balancer is not None and self.replica is not None:
            self.balancer.record(self.sizes[self.replica], compute_s)
            self.balancer.end_iteration()
        if self.steps % self.every == 0:
            sizes = torch.tensor(self.balancer.sizes if self.balancer is not None else self.sizes)
            dist.broadcast(sizes, src=self.source)
            self.sizes = tuple(int(n) for n in sizes)

    def report(self) -> dict | None:
        if self.balancer is None or self.replica != 0:
            return None  # one report per stage: its first replica's
        status = self.balancer.status()
        costs = status["cost_ms_fixed_per_sample"] or []
        return {
            "stage": self.stage,
            "sizes": list(self.sizes),
            "microbatch_sizes": self.microbatch_sizes(),
            "per_sample_ms": [cost[1] for cost in costs],
            "predicted_imbalance": status["predicted_imbalance"],
            "rebalances": len(status["decisions"]),
        }
