"""Pipeline-parallel training throughput: ours (GPipe, 1F1B-flush, 1F1B-stash) against one process
and against torch.distributed.pipelining's Schedule1F1B on the same 2-stage partition.

The model is an MLP of wide Linear layers, so each stage is compute-bound. Each pipeline rank runs
with 1 intra-op thread; the single-process baseline runs with 1 thread (the ratio's baseline) and
2 threads (reported beside it). Also prints the schedule simulator's predicted bubble fraction for
4 to 16 stages.

With ``--device cuda`` (bench/gpu_check.sh) every system runs on the GPU instead: the two ranks
on cuda:0 and cuda:1 with NCCL, or, with one GPU, both on cuda:0 with gloo carrying the messages
through CPU memory (``cloud.training.device``); torch's pipelining needs NCCL for GPU tensors, so
it is left out then. The single-process baseline runs once (threads do not apply).

    python -m bench.pipeline [--quick] [--device cpu|cuda]   -> bench/results/pipeline.json
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bench._common import Results
from cloud.training import comm
from cloud.training.device import Placement, activate, resolve
from cloud.training.executor import StageExecutor
from cloud.training.partition import partition
from cloud.training.profiler import profile_layers
from cloud.training.schedules import ScheduleName, Topology, build_schedule, predicted_bubble

OURS: tuple[ScheduleName, ...] = ("gpipe", "1f1b-flush", "1f1b-stash")
# the simulator's bubble rows: (schedule, microbatches), each for 4 to 16 stages
SIMULATED: tuple[tuple[ScheduleName, int], ...] = (("gpipe", 16), ("1f1b-flush", 16), ("1f1b-stash", 64))


def wide_mlp(width: int, depth: int) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def make_data(cfg: dict, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(cfg["batch"], cfg["width"], generator=generator)
    y = torch.randint(0, 10, (cfg["batch"],), generator=generator)
    return x.to(device), y.to(device)


def _wait_for(device: torch.device | str) -> None:
    """A GPU runs kernels asynchronously: a timer must wait for them."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def single_process(cfg: dict, threads: int, device: str = "cpu") -> float:
    torch.set_num_threads(threads)
    model, (x, y) = wide_mlp(cfg["width"], cfg["depth"]).to(device), make_data(cfg, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn, m = nn.CrossEntropyLoss(), cfg["microbatches"]

    def step() -> None:
        optimizer.zero_grad()
        for xb, yb in zip(x.chunk(m), y.chunk(m), strict=True):
            (loss_fn(model(xb), yb) / m).backward()
        optimizer.step()

    step()
    _wait_for(device)
    start = time.perf_counter()
    for _ in range(cfg["steps"]):
        step()
    _wait_for(device)
    return cfg["batch"] * cfg["steps"] / (time.perf_counter() - start)


def _timed(placement: Placement, cfg: dict, step) -> float:
    step()  # warm-up (and shape inference for torch's stages)
    _wait_for(placement.device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(cfg["steps"]):
        step()
    _wait_for(placement.device)
    dist.barrier()
    return cfg["batch"] * cfg["steps"] / (time.perf_counter() - start)


def _stage_module(cfg: dict, rank: int, device: torch.device) -> nn.Sequential:
    first, last = cfg["stages"][rank]
    stage = wide_mlp(cfg["width"], cfg["depth"])[first : last + 1].to(device)
    assert isinstance(stage, nn.Sequential)  # a slice of a Sequential is one
    return stage


def _ours(rank: int, cfg: dict, name: ScheduleName, placement: Placement, channels: comm.Channels) -> float:
    module = _stage_module(cfg, rank, placement.device)
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    topology = Topology((1, 1))
    executor = StageExecutor(
        module, topology, rank, optimizer=optimizer, loss_fn=nn.CrossEntropyLoss(), channels=channels
    )
    schedule = build_schedule(name, [1, 1], cfg["microbatches"])
    x, y = make_data(cfg, placement.device)
    xs = dict(enumerate(x.chunk(cfg["microbatches"])))
    ys = dict(enumerate(y.chunk(cfg["microbatches"])))
    return _timed(
        placement,
        cfg,
        lambda: executor.run_step(schedule, xs if rank == 0 else None, ys if rank == 1 else None),
    )


def _torch_1f1b(rank: int, cfg: dict, placement: Placement) -> float:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    module = _stage_module(cfg, rank, placement.device)
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    stage = PipelineStage(module, rank, 2, placement.device)
    schedule = Schedule1F1B(stage, cfg["microbatches"], loss_fn=nn.CrossEntropyLoss())
    x, y = make_data(cfg, placement.device)

    def step() -> None:
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        optimizer.step()

    return _timed(placement, cfg, step)


def _placement(device: str, rank: int) -> Placement:
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    return resolve("cuda" if device == "cuda" else "cpu", local_rank=rank, local_world=2, gpus=gpus)


def _worker(rank: int, cfg: dict, port: int, queue: Any) -> None:
    torch.set_num_threads(1)
    placement = _placement(cfg["device"], rank)
    activate(placement)
    dist.init_process_group(
        placement.backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=120),
    )
    try:
        channels = (
            comm.Channels.create([[0], [1]]) if placement.backend == "nccl" else comm.Channels.default()
        )
        measured: dict[str, float] = {}
        # Rounds interleave the systems and keep each one's best, so that a burst of load from other
        # processes on the cores does not land on one system only.
        for _ in range(cfg["rounds"]):
            runs: dict[str, Callable[[], float]] = {}
            if placement.device.type == "cpu" or placement.backend == "nccl":  # see the docstring
                runs["torch_pipelining_1f1b"] = partial(_torch_1f1b, rank, cfg, placement)
            runs.update(
                {f"ours_{name}": partial(_ours, rank, cfg, name, placement, channels) for name in OURS}
            )
            for system, run in runs.items():
                measured[system] = max(measured.get(system, 0.0), run())
        if rank == 0:
            queue.put(measured)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where every system runs")
    args = parser.parse_args()
    # 16 microbatches for 2 stages (PipeDream and GPipe ask for m >= 4 x stages): the fill-and-drain
    # bubble of every synchronous schedule here, torch's included, is then 1/17 of a step.
    quick = {"width": 768, "depth": 8, "batch": 512, "microbatches": 16, "steps": 3, "rounds": 2}
    full = {"width": 1024, "depth": 8, "batch": 512, "microbatches": 16, "steps": 10, "rounds": 3}
    cfg: dict[str, Any] = dict(quick if args.quick else full)  # gains the partition's stages
    cfg["device"] = args.device
    model, (x, _) = wide_mlp(cfg["width"], cfg["depth"]).to(args.device), make_data(cfg, args.device)
    costs = profile_layers(model, x[: cfg["batch"] // cfg["microbatches"]], threads=1, repeats=3)
    plan = partition(costs, 2, 1e9, straight=True)  # the partitioner picks the split both peers use
    cfg["stages"] = [(s.first, s.last) for s in plan.stages]
    results = Results("pipeline", args.quick)
    case = f"mlp {cfg['depth']}x{cfg['width']} batch {cfg['batch']} m={cfg['microbatches']}"
    threads = (1, 2) if args.device == "cpu" else (1,)
    single = {t: max(single_process(cfg, t, args.device) for _ in range(cfg["rounds"])) for t in threads}
    torch.set_num_threads(1)
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    os.environ["OMP_NUM_THREADS"] = "1"
    mp.start_processes(_worker, args=(cfg, _free_port(), queue), nprocs=2, start_method="spawn")
    measured = queue.get()
    names = (
        {1: "single_process_1thread", 2: "single_process_2threads"}
        if args.device == "cpu"
        else {1: "single_process"}
    )
    systems = {**{names[t]: value for t, value in single.items()}, **measured}
    for system, value in systems.items():
        results.add(case, system, "samples_per_s", round(value, 2))
    for stages in (4, 8, 12, 16):
        for name, m in SIMULATED:
            bubble = round(predicted_bubble(name, stages, m), 4)
            results.add(f"{stages} stages m={m}", f"simulator_{name}", "bubble_fraction", bubble)
    best = max(measured[f"ours_{n}"] for n in OURS)
    results.ratios["vs_single_process"] = round(best / single[1], 3)
    if 2 in single:
        results.ratios["vs_single_process_2threads"] = round(best / single[2], 3)
    peer = measured.get("torch_pipelining_1f1b")
    if peer:
        results.ratios["vs_torch_pipelining_1f1b"] = round(measured["ours_1f1b-flush"] / peer, 3)
        results.ratios["best_vs_torch_pipelining_1f1b"] = round(best / peer, 3)
    results.extra["device"] = args.device
    print(f"partition: {plan.text()}")
    print(f"{'case':<40} {'system':<28} {'metric':<16} value")
    for row in results.rows:
        print(f"{row['case']:<40} {row['system']:<28} {row['metric']:<16} {row['value']}")
    print("ratios:", results.ratios)
    print(
        f"load average during the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus "
        "(other processes on the cores skew every figure)"
    )
    results.write(table=False)


if __name__ == "__main__":
    main()
