"""Under torchrun (2, 3 or 4 ranks, gloo): every program kind run by ``Executor`` against
torch.distributed's own collective, for sizes from 1 element to 64 MB, in one launch.

Programs: all-reduce by ring, double binary tree and trees packed into an asymmetric fabric;
broadcast and reduce by packed trees (from a root that is not rank 0 where there is one) and by a
chain (the ring's shape as a tree). Data: integer-valued float32 (the sum must be bit-identical),
random float32 and float64 (allclose: the order of the additions differs), int64, and
integer-valued bfloat16 on small sizes. Each rank writes, per case, whether it matched.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cloud.training.collectives.execute import Executor
from cloud.training.collectives.plans import (
    double_binary_tree_all_reduce,
    packed_program,
    ring_all_reduce,
    tree_program,
)
from cloud.training.collectives.program import Kind, Program, validate
from cloud.training.collectives.topology import Link, Topology
from cloud.training.collectives.trees import Tree
from tests.harness.torchrun import init_worker, write_result

SIZES = (1, 2, 3, 5, 7, 1000, 65_537, 1_000_003, 16 * 2**20)  # elements; the last is 64 MB of float32
BIG = 1_000_003  # from here on: integer-valued float32 only (time on 2 cores)
CHUNK = 1 << 16


def lopsided(world: int) -> Topology:
    """Fast links between neighbours, slow ones elsewhere, the last rank fast only to its left."""
    links = []
    for a in range(world):
        for b in range(world):
            if a != b:
                fast = abs(a - b) == 1 or (a < world - 1 and b < world - 1)
                links.append(Link(a, b, 100e6 if fast else 10e6, 1e-4))
    return Topology(tuple(f"r{r}" for r in range(world)), tuple(links))


def chain(world: int, root: int) -> Tree:
    """root -> root+1 -> ... around the ring: every rank's parent is the one before it."""
    parent: list[int | None] = [None] * world
    for step in range(1, world):
        parent[(root + step) % world] = (root + step - 1) % world
    return Tree(root, tuple(parent))


def programs(world: int, numel: int) -> dict[str, Program]:
    fabric, root = lopsided(world), world - 1
    chunk = min(CHUNK, max(1, numel // 4))
    built: dict[str, Program] = {
        "all_reduce/ring": ring_all_reduce(world, numel),
        "all_reduce/double_tree": double_binary_tree_all_reduce(world, numel, chunk),
        "all_reduce/trees": packed_program(fabric, "all_reduce", numel, chunk=chunk),
    }
    kinds: tuple[Kind, ...] = ("broadcast", "reduce")
    for kind in kinds:
        built[f"{kind}/trees"] = packed_program(fabric, kind, numel, root=root, chunk=chunk)
        built[f"{kind}/chain"] = tree_program(kind, [chain(world, root)], [1.0], numel, chunk)
    for program in built.values():
        validate(program, numel)
    return built


def inputs(rank: int, numel: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * rank + numel)
    integers = torch.randint(-(2**10), 2**10, (numel,), generator=generator)
    data = {"int_f32": integers.float()}
    if numel < BIG:
        data |= {
            "f32": torch.randn(numel, generator=generator),
            "f64": torch.randn(numel, generator=generator, dtype=torch.float64),
            "i64": integers * 2**33,
            "int_bf16": (integers % 16).bfloat16(),
        }
    return data


def reference(kind: str, tensor: torch.Tensor, root: int) -> torch.Tensor:
    expected = tensor.clone()
    if kind == "all_reduce":
        dist.all_reduce(expected)
    elif kind == "broadcast":
        dist.broadcast(expected, root)
    else:
        dist.reduce(expected, root)
    return expected


def main() -> None:
    rank, world = init_worker()
    executor = Executor(timeout_s=600)
    failures: list[str] = []
    cases = 0
    for numel in SIZES:
        for name, program in programs(world, numel).items():
            kind = program.kind
            root = program.root if program.root is not None else 0
            for dtype_name, tensor in inputs(rank, numel).items():
                expected = reference(kind, tensor, root)
                got = executor.run(program, tensor.clone())
                if kind == "reduce" and rank != root:
                    continue  # only the root's result is defined, as with dist.reduce
                exact = dtype_name.startswith("int")
                same = (
                    torch.equal(got, expected)
                    if exact
                    else torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
                )
                cases += 1
                if not same:
                    failures.append(f"{name} {dtype_name} numel={numel}")
    write_result({"cases": cases, "failures": failures, "runs": executor.calls})


if __name__ == "__main__":
    main()
