"""Barrier-scheduled sync vs plain DDP on a communication-heavy model over a slow emulated link.

Two ranks under torchrun (gloo). gloo over loopback cannot be slowed with netem here, so the link
is emulated identically for every system: each all-reduce message passes through a ``CommThread``
whose ``LinkDelay`` holds a wire shared by the process's lanes for ``per_message_s + per_byte_s *
bytes`` (a sleep: the host's CPU stays free, as it does while a real NIC sends) before the real
gloo all-reduce runs. DDP gets it through a comm hook; ours through the scheduler's lanes (the
priority lane shares the same wire, so it adds no bandwidth; it only goes first).

Systems, interleaved in each repetition so a change in the box's load hits all of them:
- ``compute_only``: the same forward/backward/step with no sync at all (the floor; not a baseline);
- ``ddp_default``: DDP with its default buckets (25 MB cap, 1 MB first bucket);
- ``ddp_layer_buckets``: DDP with ``bucket_cap_mb`` = one layer's weight, i.e. the same per-layer
  messages as ours, so it overlaps its all-reduces with backward as ours does;
- ``sync_fifo``: ours with the engine off (per-layer, sent as ready, FIFO);
- ``sync_scheduler``: ours, adaptive (the engine measures blockage and re-decides every window).
``--quick`` runs only the two DDP baselines and ours. Each system keeps its model across rounds.
After a warm-up of every system, ours runs until its engine has kept one policy for three windows
(at most 60 iterations in ``--quick``): the settling cost, reported as its iteration count and
mean iteration time. Then rounds run a few iterations of each system in turn and drop the first of
each (cold after the switch: ours drained its syncs when the previous round ended). The engine stays
on while measured; the decisions it made then are counted in the output.
Where ours can win by design: each layer's sync overlaps the rest of backward and, with the lazy
per-layer step, the next forward; the engine sends the layers the next forward needs first.
The fabric row (run with the link of record): 4 ranks on ``bench._collectives_real``'s asymmetric
fabric (every ring crosses a 12.5 MB/s hop; spanning trees avoid most of it), paced per directed
link by ``collectives.fabric`` instead of a ``LinkDelay``, with a narrower model (6x linear 256):
``ddp_default`` is DDP whose buckets the best ring sums on that fabric (the ring gloo or NCCL
would run there), ``ddp_trees`` DDP on packed trees, ``sync_scheduler`` ours with its lanes on the
packed trees (``sync.collective = "trees"``); ``vs_ddp_trees_asym`` = ddp_default / ours per
round, median (target >= 1.3).
``--link MB/s,ms`` emulates another link (default: the link of record, 400 MB/s + 3 ms per message).
Figure: median wall time per iteration after warm-up (forward + backward + step); ratio ``vs_ddp``
= ddp_default / sync_scheduler per round, reported as the median over rounds with its min and
max; ``vs_ddp_layer_buckets`` likewise.

    python -m bench.sync [--quick] [--link MB/s,ms]   -> bench/results/sync.json
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bench._common import Results
from bench._torchrun import launch, leave_together, write_rank_result
from cloud.training.sync.link import CommThread, LinkDelay, Reducer
from cloud.training.sync.scheduler import SyncScheduler

WIDTH, DEPTH, BATCH = 768, 6, 48
LINK_OF_RECORD = "400,3"  # MB/s, ms per message: the link bench/results/sync.json is measured on


def parse_link(text: str) -> LinkDelay:
    """``"MB/s,ms"``: the emulated link's bandwidth and fixed cost per message."""
    try:
        mb_per_s, ms = (float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--link wants MB/s,ms per message (e.g. 400,3), got {text!r}") from None
    if mb_per_s <= 0 or ms < 0:
        raise ValueError(f"--link needs a positive bandwidth and a fixed cost >= 0, got {text!r}")
    return LinkDelay(per_message_s=ms / 1e3, per_byte_s=1 / (mb_per_s * 1e6))


SYSTEMS = ("compute_only", "ddp_default", "ddp_layer_buckets", "sync_fifo", "sync_scheduler")
# the fabric row: 4 ranks on bench._collectives_real's asymmetric fabric, a narrower model (its
# gradients cross 12.5 MB/s links), DDP on the best ring vs ours on packed trees
FABRIC_SYSTEMS = ("ddp_default", "ddp_trees", "sync_scheduler")
FABRIC_WIDTH, FABRIC_WORLD = 256, 4


def make_model(width: int = WIDTH) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def make_optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def ddp_hook(comm, bucket):
    tensor = bucket.buffer().div_(dist.get_world_size())
    result: torch.futures.Future = torch.futures.Future()
    comm.submit(tensor, (f"bucket{bucket.index()}",)).on_done(lambda _p: result.set_result(tensor))
    return result


class System:
    """One system's model and training step, kept alive across rounds so rounds can interleave."""

    def __init__(
        self,
        name: str,
        initial: nn.Module,
        data: tuple,
        link: LinkDelay,
        reducer_for: Callable[[dist.ProcessGroup | None], Reducer] | None = None,
    ) -> None:
        """``reducer_for``: the all-reduce of each comm lane (None: gloo's own)."""
        self.name = name
        self.model = copy.deepcopy(initial)
        self.comm: CommThread | None = None
        self.sync: SyncScheduler | None = None
        self.x, self.y = data
        if name.startswith("sync"):
            self.sync = SyncScheduler(
                self.model,
                make_optimizer,
                group=dist.new_group(backend="gloo"),
                window=4,
                link=link,
                adaptive=name != "sync_fifo",
                reducer_for=reducer_for,
            )
            return
        if name.startswith("ddp"):
            group = dist.new_group(backend="gloo")
            self.comm = CommThread(group, link, reducer=reducer_for(group) if reducer_for else None)
            layer_mb = WIDTH * WIDTH * 4 / 2**20
            options: dict[str, Any] = {"bucket_cap_mb": layer_mb} if name == "ddp_layer_buckets" else {}
            self.model = DistributedDataParallel(self.model, **options)
            self.model.register_comm_hook(self.comm, ddp_hook)
        self.optimizer = make_optimizer(list(self.model.parameters()))

    def step(self) -> None:
        if self.sync is None:
            self.optimizer.zero_grad()
        nn.functional.cross_entropy(self.model(self.x), self.y).backward()
        if self.sync is None:
            self.optimizer.step()

    def run(self, steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            self.step()
            times.append(time.perf_counter() - started)
        if self.sync is not None:
            self.sync.finish()  # nothing in flight when the next system runs
        return times

    def close(self) -> dict:
        if self.comm is not None:
            self.comm.close()
        if self.sync is None:
            return {}
        self.sync.close()
        return self.sync.status()


def settle(system: System, min_windows: int, max_iterations: int) -> dict:
    """Run ours until its engine has kept one policy for ``min_windows`` windows (bounded); the
    time this takes is the settling cost, reported beside the settled figure."""
    assert system.sync is not None
    times: list[float] = []
    while len(times) < max_iterations:
        times += system.run(system.sync.window)
        decided = [d["window"] for d in system.sync.engine.decisions]
        if system.sync.window_index - (max(decided) + 1 if decided else 0) >= min_windows:
            break
    mean = torch.tensor(statistics.mean(times))
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    return {
        "iterations": len(times),
        "mean_iteration_s": float(mean),
        "policy": system.sync.policy.text(),
        "decisions": len(system.sync.engine.decisions),
    }


def fabric_reducers() -> dict[str, Callable[[dist.ProcessGroup | None], Reducer]]:
    """The fabric row's all-reduce per system: the best ring for DDP (what gloo's or NCCL's ring
    would do on that fabric), packed trees for ours and ``ddp_trees``, paced on the fabric."""
    from bench._collectives_real import asymmetric_fabric
    from cloud.training.collectives.reducer import reducer_factory

    ring = reducer_factory("ring", asymmetric_fabric(), emulate=True)
    trees = reducer_factory("trees", asymmetric_fabric(), emulate=True)
    return {"ddp_default": ring, "ddp_trees": trees, "sync_scheduler": trees}


def worker(quick: bool, link: LinkDelay, fabric: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    warmup, rounds, per_round, skip = (6, 10, 3, 1) if quick else (20, 30, 4, 1)
    # --quick keeps the baselines and ours; the floor and the engine-off variant only in the full run
    systems_run = SYSTEMS if not quick else ("ddp_default", "ddp_layer_buckets", "sync_scheduler")
    reducers = fabric_reducers() if fabric else {}
    if fabric:
        warmup, rounds, systems_run = (3, 5, FABRIC_SYSTEMS) if quick else (6, 15, FABRIC_SYSTEMS)
    width = FABRIC_WIDTH if fabric else WIDTH
    generator = torch.Generator().manual_seed(dist.get_rank())
    data = (
        torch.randn(BATCH, width, generator=generator),
        torch.randint(0, 10, (BATCH,), generator=generator),
    )
    initial = make_model(width)
    systems = [System(name, initial, data, link, reducers.get(name)) for name in systems_run]
    for system in systems:
        system.run(warmup)
    ours = next(system for system in systems if system.name == "sync_scheduler")
    assert ours.sync is not None
    settling = settle(ours, min_windows=3, max_iterations=(30 if fabric else 60) if quick else 200)
    decisions_settled = len(ours.sync.engine.decisions)
    medians: dict[str, list[float]] = {system.name: [] for system in systems}
    for _ in range(rounds):  # interleaved, so a change in the box's load hits every system
        for system in systems:
            dist.barrier()
            times = system.run(per_round)[skip:]  # the first iteration after a switch starts cold
            median = torch.tensor(statistics.median(times))
            dist.all_reduce(median, op=dist.ReduceOp.MAX)  # the slower rank sets the pace
            medians[system.name].append(float(median))
    statuses = {system.name: system.close() for system in systems}
    if dist.get_rank() == 0:
        status = statuses["sync_scheduler"]
        write_rank_result(
            {
                "medians": medians,
                "policy": status["policy"],
                "decisions": status["decisions"],
                "decisions_while_measured": len(status["decisions"]) - decisions_settled,
                "settling": settling,
                "last_window": status["last_window"],
                "warmup": warmup,
                "rounds": rounds,
                "per_round": per_round,
                "skip": skip,
            },
            0,
        )
    leave_together()


def add_rounds(results: Results, case: str, medians: dict[str, list[float]], ratios: dict[str, str]) -> None:
    """Each system's iteration time over rounds, and each ratio (baseline / ours per round; its
    median, min and max) whose baseline ran."""
    for system, values in medians.items():
        results.add(case, system, "iteration_ms_median_over_rounds", statistics.median(values) * 1e3)
        results.add(case, system, "iteration_ms_min_round", min(values) * 1e3)
        results.add(case, system, "iteration_ms_max_round", max(values) * 1e3)
    for name, baseline in ratios.items():
        if baseline not in medians:
            continue
        per_round = [b / o for b, o in zip(medians[baseline], medians["sync_scheduler"], strict=True)]
        results.ratios[name] = statistics.median(per_round)
        results.add(case, name, "ratio_min_round", min(per_round))
        results.add(case, name, "ratio_max_round", max(per_round))


def fabric_row(results: Results, quick: bool) -> None:
    """4 ranks on the asymmetric fabric: ``vs_ddp_trees_asym`` = DDP on the best ring / ours on
    packed trees; ``ddp_trees`` (DDP on the trees) shows what the trees alone give."""
    from bench._collectives_real import FAST, LATENCY, SLOW

    args = ["--fabric"] + (["--quick"] if quick else [])
    figures = launch("bench.sync", args, nproc=FABRIC_WORLD, timeout_s=600)
    case = (
        f"{DEPTH}x linear {FABRIC_WIDTH}, batch {BATCH}, {FABRIC_WORLD} ranks, asymmetric fabric "
        f"{FAST / 1e6:g}/{SLOW / 1e6:g} MB/s + {LATENCY * 1e3:g} ms, {figures['rounds']} rounds"
    )
    add_rounds(results, case, figures["medians"], {"vs_ddp_trees_asym": "ddp_default"})
    per_round = [
        d / t for d, t in zip(figures["medians"]["ddp_default"], figures["medians"]["ddp_trees"], strict=True)
    ]
    results.add(case, "ddp_trees", "vs_ddp_default_median", statistics.median(per_round))
    results.add(case, "sync_scheduler", "settling_iterations", figures["settling"]["iterations"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--link",
        default=LINK_OF_RECORD,
        metavar="MB/s,ms",
        help=f"emulated link: bandwidth and fixed cost per message (default "
        f"{LINK_OF_RECORD}; another writes bench/results/sync_link_<MB/s>_<ms>.json)",
    )
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--fabric", action="store_true", help="(worker) the 4-rank asymmetric fabric row")
    args = parser.parse_args()
    try:
        link = parse_link(args.link)
    except ValueError as error:
        parser.error(str(error))
    if args.worker:
        worker(args.quick, LinkDelay() if args.fabric else link, args.fabric)
        return
    started = time.perf_counter()
    figures = launch("bench.sync", ["--link", args.link] + (["--quick"] if args.quick else []))
    medians = figures["medians"]
    name = "sync" if args.link == LINK_OF_RECORD else "sync_link_" + args.link.replace(",", "_")
    results = Results(name, args.quick)
    case = (
        f"{DEPTH}x linear {WIDTH}, batch {BATCH}, link {1e-6 / link.per_byte_s:.0f}MB/s + "
        f"{link.per_message_s * 1e3:g}ms/msg, {figures['rounds']} rounds"
    )
    add_rounds(
        results,
        case,
        medians,
        {"vs_ddp": "ddp_default", "vs_ddp_layer_buckets": "ddp_layer_buckets", "vs_sync_fifo": "sync_fifo"},
    )
    settling = figures["settling"]
    results.add(case, "sync_scheduler", "settling_iterations", settling["iterations"])
    results.add(case, "sync_scheduler", "settling_iteration_ms_mean", settling["mean_iteration_s"] * 1e3)
    results.add(case, "sync_scheduler", "decisions_while_measured", figures["decisions_while_measured"])
    if args.link == LINK_OF_RECORD:
        fabric_row(results, args.quick)
    results.add(case, "all", "bench_seconds", time.perf_counter() - started)
    results.write()
    print(f"sync_scheduler final policy: {figures['policy']}")
    for decision in figures["decisions"]:
        print("  decision:", decision)
    last = figures["last_window"]
    if last:
        print(f"  last window, {last['iteration_ms']:.1f} ms/iter (per layer, ms):")
        columns = [key for key in last["layers"][0] if key.endswith("_ms")]
        print("    layer " + " ".join(f"{key[:-3]:>8}" for key in columns))
        for layer in last["layers"]:
            print(f"    {layer['layer']:>5} " + " ".join(f"{layer[key]:8.2f}" for key in columns))


if __name__ == "__main__":
    main()
