"""Barrier-scheduled sync vs plain DDP on a communication-heavy model over a slow emulated link.

Two ranks under torchrun (gloo). gloo over loopback cannot be slowed with netem here, so the link
is emulated identically for both systems: every all-reduce message passes through a ``CommThread``
whose ``LinkDelay`` holds a shared wire for ``per_message_s + per_byte_s * bytes`` before the real
all-reduce is launched. DDP gets it through a comm hook (its default 25 MB buckets); ours through
the scheduler's lanes (the second lane shares the same wire, so it adds no bandwidth). Model: a
stack of wide Linear layers at a small batch (little compute, many bytes). Figure: mean wall time
per iteration after warm-up; ratio ``vs_ddp`` = DDP time / ours (higher is better).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from bench._torchrun import launch, write_rank_result  # noqa: E402
from bench.common import Results  # noqa: E402
from cloud.training.sync.link import CommThread, LinkDelay  # noqa: E402
from cloud.training.sync.scheduler import SyncScheduler  # noqa: E402

WIDTH, DEPTH, BATCH = 768, 6, 32
LINK = LinkDelay(per_message_s=0.002, per_byte_s=1 / 400e6)  # ~400 MB/s shared wire, 2 ms per message


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 10))


def ddp_hook(comm, bucket):  # noqa: ANN001 (DDP rejects string annotations on a comm hook)
    tensor = bucket.buffer().div_(dist.get_world_size())
    result: torch.futures.Future = torch.futures.Future()
    comm.submit(tensor, (f"bucket{bucket.index()}",)).on_done(lambda _p: result.set_result(tensor))
    return result


def run_ddp(model: nn.Module, data: tuple, steps: int, warmup: int) -> float:
    comm = CommThread(dist.new_group(backend="gloo"), LINK)
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(comm, ddp_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x, y = data
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    comm.close()
    return sum(times[warmup:]) / (steps - warmup)


def run_ours(model: nn.Module, data: tuple, steps: int, warmup: int, window: int) -> tuple[float, dict]:
    sync = SyncScheduler(model, lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
                         group=dist.new_group(backend="gloo"), window=window, link=LINK)
    x, y = data
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        nn.functional.cross_entropy(model(x), y).backward()
        times.append(time.perf_counter() - started)
    sync.close()
    return sum(times[warmup:]) / (steps - warmup), sync.status()


def worker(quick: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    steps, warmup, window = (40, 24, 4) if quick else (120, 60, 8)
    generator = torch.Generator().manual_seed(dist.get_rank())
    data = (torch.randn(BATCH, WIDTH, generator=generator),
            torch.randint(0, 10, (BATCH,), generator=generator))
    initial = make_model()
    ddp_s = run_ddp(copy.deepcopy(initial), data, steps, warmup)
    ours_s, status = run_ours(copy.deepcopy(initial), data, steps, warmup, window)
    if dist.get_rank() == 0:
        write_rank_result({"ddp_s": ddp_s, "ours_s": ours_s, "policy": status["policy"],
                           "decisions": status["decisions"]}, 0)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args.quick)
        return
    figures = launch(Path(__file__).resolve(), ["--quick"] if args.quick else [])
    results = Results("sync", args.quick)
    case = f"{DEPTH}x linear {WIDTH}, batch {BATCH}, link 400MB/s + 2ms/msg"
    results.add(case, "ddp", "iteration_ms", figures["ddp_s"] * 1e3)
    results.add(case, "sync_scheduler", "iteration_ms", figures["ours_s"] * 1e3)
    results.ratio("vs_ddp", figures["ddp_s"], figures["ours_s"])
    results.write()
    print("final policy:", figures["policy"])
    for decision in figures["decisions"]:
        print("decision:", decision)


if __name__ == "__main__":
    main()
