"""Local training on the gateway: the math (``train_local``) and the thread it runs on (``LocalTrainer``).

``train_local`` is plain SGD with momentum over the gateway's samples for ``local_epochs`` (capped at
``max_local_steps``), plus FedProx's proximal term (mu/2)||w - w_base||^2 when the round config
says mu > 0 (Li et al., MLSys'20), and returns, in state-dict order, the delta trained - base of
every parameter and the trained values of every floating buffer (BatchNorm running statistics are
not gradient-like: averaging deltas of them, or sending them through top-k and error feedback,
can drive a running variance negative).

``LocalTrainer`` owns one worker thread: torch's intra-op threads are bounded (``threads``), and a
duty cycle holds the CPU share: after a step that took t seconds the thread sleeps
t * (1 - duty) / duty, so with duty 0.5 training takes at most about half of one core and ingest,
the log and the uplink keep the rest. The event loop never runs torch.

Invariant: at most one round trains at a time; ``interrupt`` or ``close`` (between steps) ends the
running round early with ``TrainingStopped`` and nothing is produced from a half-finished round.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn

from models.architectures import state_names
from protocol.federated import RoundConfig

_Result = TypeVar("_Result")


class TrainingStopped(Exception):
    """The trainer was stopped in the middle of a round."""


@dataclass(frozen=True)
class LocalResult:
    tensors: dict[str, torch.Tensor] = field(repr=False)  # state-dict order: deltas and buffer values
    state_names: frozenset[str]  # the floating buffers among ``tensors`` (values, not deltas)
    steps: int
    samples: int
    loss: float
    seconds: float

    @property
    def delta(self) -> dict[str, torch.Tensor]:
        """The parameters' deltas only."""
        return {name: t for name, t in self.tensors.items() if name not in self.state_names}


def duty_sleep_s(step_s: float, duty: float) -> float:
    """Pure: how long to rest after a step of ``step_s`` to hold a CPU share of ``duty``."""
    return 0.0 if duty >= 1.0 else step_s * (1.0 - duty) / duty


def train_local(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: RoundConfig,
    *,
    generator: torch.Generator,
    duty: float = 1.0,
    should_stop: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], None] = time.sleep,
) -> LocalResult:
    started = time.perf_counter()
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    anchors = [p.detach().clone() for p in model.parameters()] if config.mu > 0 else []
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    steps, total = 0, 0.0
    for _ in range(config.local_epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(order), config.batch_size):
            if steps >= config.max_local_steps:
                break
            if should_stop():
                raise TrainingStopped("stopped between steps")
            step_started = time.perf_counter()
            index = order[start : start + config.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x[index]), y[index])
            total += loss.item()
            if anchors:
                loss = loss + config.mu / 2 * sum(
                    ((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchors, strict=True)
                )
            loss.backward()
            optimizer.step()
            steps += 1
            rest = duty_sleep_s(time.perf_counter() - step_started, duty)
            if rest > 0:
                sleep(rest)
    trained = model.state_dict()
    buffers = state_names(model)
    tensors = {
        k: trained[k].detach().clone() if k in buffers else (trained[k] - base[k]).detach()
        for k in base
        if base[k].is_floating_point()
    }
    return LocalResult(tensors, buffers, steps, len(y), total / max(1, steps), time.perf_counter() - started)


class LocalTrainer:
    def __init__(self, *, threads: int = 1, duty: float = 0.5, seed: int = 0) -> None:
        if threads < 1 or not 0.0 < duty <= 1.0:
            raise ValueError("threads must be >= 1 and duty in (0, 1]")
        self.threads, self.duty = threads, duty
        self._generator = torch.Generator().manual_seed(seed)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="fl-trainer", initializer=self._init_thread)
        self._stop = threading.Event()
        self._generation = 0  # interrupt() bumps it: a round started under an older one stops
        self.rounds = 0

    def _init_thread(self) -> None:
        # Process-wide in torch: a gateway trains in one place only, so this bounds all of its torch work.
        torch.set_num_threads(self.threads)

    async def run(self, fn: Callable[..., _Result], *args: object) -> _Result:
        """Run any torch work (training, encoding) on the trainer's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def train(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: RoundConfig
    ) -> LocalResult:
        generation = self._generation

        def work() -> LocalResult:
            return train_local(
                model,
                x,
                y,
                config,
                generator=self._generator,
                duty=self.duty,
                should_stop=lambda: self._stop.is_set() or self._generation != generation,
            )

        result = await self.run(work)
        self.rounds += 1
        return result

    def interrupt(self) -> None:
        """End the running round at its next step (its ``train`` raises TrainingStopped); later rounds run."""
        self._generation += 1

    def close(self) -> None:
        """Stop a running round at its next step and release the thread (waits for it)."""
        self._stop.set()
        self._executor.shutdown(wait=True)
