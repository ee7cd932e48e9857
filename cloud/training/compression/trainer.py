"""A single-process trainer with compressed activations: the reference that the pipeline
runtime's compressed stages are compared against, and what the tests and bench run.

``fit_compressed`` trains any model with any loss, optimizer and loader of (inputs, targets)
batches, with an optional evaluation after each epoch. ``train_compressed`` is it with the digits
recipe: it mirrors ``models.digits.train_single_process`` (SGD with momentum 0.9, same batch order
for a seed) so that fp32 and compressed runs differ only in what is stored for backward.

Invariant: with ``compressor=None`` this is the plain fp32 trainer; with a controller, every
``window``-th step (and the first) also runs a full-precision probe of the same batch before the
compressed step and feeds the controller (the gradient error of the whole model and of each layer
that owns parameters), whose new policy takes effect from the next step; except where the
compressor knows the step is exactly fp32's (``next_step_is_exact``: nothing it saves is large
enough to encode), whose probe would measure no error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from cloud.training.compression.controller import AdaptiveController
from cloud.training.compression.hooks import ActivationCompressor, leaf_names
from models.digits import DigitsSplit


@dataclass
class TrainResult:
    epoch_losses: list[float] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0
    probe_grad_errors: list[float] = field(default_factory=list)
    step_cpu_s: list[float] = field(default_factory=list)  # per step, probe included (process CPU time)
    step_wall_s: list[float] = field(default_factory=list)  # per step, probe included
    probe_steps: list[int] = field(default_factory=list)  # steps that ran a full-precision probe
    evaluations: list[float] = field(default_factory=list)  # evaluate(model, epoch) after each epoch

    @property
    def step_seconds(self) -> float:
        return self.seconds / max(1, self.steps)


def grad_errors(
    reference: list[torch.Tensor], params: list[nn.Parameter], owners: list[str]
) -> tuple[float, dict[str, float]]:
    """Relative gradient error against the probe, of the whole model and per layer (``owners[i]``
    owns ``params[i]``), from one pass over the gradients. A layer's weight gradient reads its saved
    input, so a format that damages one small layer's gradient shows in its own error even when
    the whole model's, dominated by the largest layers, looks fine."""
    sums: dict[str, list[float]] = {}
    for p, r, owner in zip(params, reference, owners, strict=True):
        entry = sums.setdefault(owner, [0.0, 0.0])
        entry[0] += float(((_grad(p) - r) ** 2).sum())
        entry[1] += float((r**2).sum())
    num, den = sum(n for n, _ in sums.values()), sum(d for _, d in sums.values())
    whole = (num / den) ** 0.5 if den > 0 else 0.0
    return whole, {owner: (n / d) ** 0.5 for owner, (n, d) in sums.items() if d > 0}


def _grad(param: nn.Parameter) -> torch.Tensor:
    if param.grad is None:
        raise ValueError("a parameter has no gradient: it does not reach the loss")
    return param.grad


def relative_grad_error(reference: list[torch.Tensor], params: list[nn.Parameter]) -> float:
    return grad_errors(reference, params, [""] * len(params))[0]


def layer_grad_errors(
    reference: list[torch.Tensor], params: list[nn.Parameter], owners: list[str]
) -> dict[str, float]:
    return grad_errors(reference, params, owners)[1]


def _parameter_owners(model: nn.Module, params: list[nn.Parameter]) -> list[str]:
    owner_of = {
        id(p): name for name in leaf_names(model) for p in model.get_submodule(name).parameters(recurse=False)
    }
    return [owner_of.get(id(p), "") for p in params]


@dataclass
class _Probe:
    """The adaptive controller's full-precision probe: a batch's fp32 gradients, then the
    compressed step's errors against them, fed to the controller."""

    controller: AdaptiveController
    compressor: ActivationCompressor  # the one the controller's policy steers
    params: list[nn.Parameter]
    owners: list[str]  # the leaf layer of each parameter

    def reference(
        self,
        model: nn.Module,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        optimizer: torch.optim.Optimizer,
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> list[torch.Tensor]:
        """The batch's fp32 gradients; the compressed step that follows measures its layers' errors.

        The probe draws the same random numbers (dropout masks) as the compressed step after it and
        leaves the model's buffers (BatchNorm running statistics) as it found them, so the two
        differ only in what backward read and the probe does not count as a training step."""
        optimizer.zero_grad()
        buffers = [b.detach().clone() for b in model.buffers()]
        devices = [x.device] if x.device.type != "cpu" else []
        with torch.random.fork_rng(devices=devices, device_type=x.device.type if devices else "cuda"):
            loss_fn(model(x), y).backward()
        with torch.no_grad():
            for buffer, saved in zip(model.buffers(), buffers, strict=True):
                buffer.copy_(saved)
        reference = [_grad(p).detach().clone() for p in self.params]
        self.compressor.measure_errors = True
        self.compressor.layer_errors.clear()
        return reference

    def decide(self, step: int, reference: list[torch.Tensor]) -> float:
        """After the compressed backward: the controller moves formats; returns the gradient error."""
        self.compressor.measure_errors = False
        grad_error, per_layer = grad_errors(reference, self.params, self.owners)
        self.controller.decide(step, grad_error, self.compressor.layer_errors, per_layer)
        self.compressor.policy = self.controller.policy
        return grad_error


Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets)
Evaluate = Callable[[nn.Module, int], float]  # (model, epochs done) -> a score, e.g. held-out accuracy


def fit_compressed(
    model: nn.Module,
    loader: Iterable[Batch] | Callable[[int], Iterable[Batch]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    compressor: ActivationCompressor | None = None,
    controller: AdaptiveController | None = None,
    epochs: int = 1,
    evaluate: Evaluate | None = None,
) -> TrainResult:
    """Train any model on any data with compressed activations.

    ``loader``: an iterable of (inputs, targets) batches read once per epoch (a ``DataLoader``), or
    a function of the epoch index returning one. ``loss_fn(model(inputs), targets)`` is the loss;
    ``optimizer`` steps the model's parameters. ``evaluate(model, epoch)``, when given, runs after
    each epoch (the model in train mode again afterwards) and its score goes to
    ``TrainResult.evaluations``. With a controller, every ``window``-th step also runs the
    full-precision probe of the same batch (the controller's metrics), whose gradients are
    discarded before the compressed step."""
    if controller is not None and compressor is None:
        raise ValueError("controller: an adaptive controller needs a compressor to apply its policy")
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    probe = None
    if controller is not None and compressor is not None:
        compressor.policy = controller.policy
        probe = _Probe(controller, compressor, params, _parameter_owners(model, params))
    result, step = TrainResult(), 0
    started = time.perf_counter()
    for epoch in range(epochs):
        total, batches = 0.0, 0
        for x, y in loader(epoch) if callable(loader) else loader:
            wall_started, cpu_started = time.perf_counter(), time.process_time()
            reference = None
            if (
                probe is not None
                and probe.controller.probe_due(step)
                and not probe.compressor.next_step_is_exact()
            ):
                reference = probe.reference(model, loss_fn, optimizer, x, y)
            optimizer.zero_grad()
            if compressor is None:
                loss = loss_fn(model(x), y)
            else:
                with compressor.active():
                    loss = loss_fn(model(x), y)
            loss.backward()
            loss_value = loss.item()
            if controller is not None:
                controller.record_loss(loss_value)
            if probe is not None and reference is not None:
                result.probe_grad_errors.append(probe.decide(step, reference))
            optimizer.step()
            total, batches = total + loss_value, batches + 1
            result.step_cpu_s.append(time.process_time() - cpu_started)
            result.step_wall_s.append(time.perf_counter() - wall_started)
            if reference is not None:
                result.probe_steps.append(step)
            step += 1
        if batches == 0:
            raise ValueError("loader: an epoch yielded no batches")
        result.epoch_losses.append(total / batches)
        if evaluate is not None:
            result.evaluations.append(_evaluated(model, evaluate, epoch + 1))
    result.seconds = time.perf_counter() - started
    result.steps = step
    return result


def _evaluated(model: nn.Module, evaluate: Evaluate, epochs_done: int) -> float:
    try:
        return float(evaluate(model, epochs_done))
    finally:
        model.train()


def shuffled_batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int
) -> Callable[[int], Iterator[Batch]]:
    """A loader for ``fit_compressed``: each epoch, one permutation of (x, y) from one generator
    seeded once, so two runs with the same seed see the same batches in the same order."""
    generator = torch.Generator().manual_seed(seed)

    def epoch_batches(epoch: int) -> Iterator[Batch]:
        order = torch.randperm(len(y), generator=generator).to(y.device)
        for start in range(0, len(order), batch_size):
            index = order[start : start + batch_size]
            yield x[index], y[index]

    return epoch_batches


def train_compressed(
    model: nn.Module,
    split: DigitsSplit,
    *,
    compressor: ActivationCompressor | None = None,
    controller: AdaptiveController | None = None,
    epochs: int = 10,
    batch_size: int = 32,
    lr: float = 0.05,
    seed: int = 0,
    optimizer_name: str = "sgd",
) -> TrainResult:
    """``fit_compressed`` with the digits reference recipe: cross-entropy, shuffled batches of a
    train/test split, ``optimizer_name`` "sgd" (momentum 0.9, as the digits reference) or "adam"
    (the scene one)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer: torch.optim.Optimizer
    if optimizer_name == "adam":
        optimizer = torch.optim.Adam(params, lr=lr)
    elif optimizer_name == "sgd":
        optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
    else:
        raise ValueError(f"optimizer_name: unknown optimizer {optimizer_name!r} (sgd, adam)")
    loader = shuffled_batches(split.train_x, split.train_y, batch_size, seed)
    return fit_compressed(
        model,
        loader,
        nn.CrossEntropyLoss(),
        optimizer,
        compressor=compressor,
        controller=controller,
        epochs=epochs,
    )


def count_saved_bytes(
    model: nn.Module, compressor: ActivationCompressor, x: torch.Tensor, y: torch.Tensor
) -> ActivationCompressor:
    """One forward+backward under the compressor with fresh counters; returns it for reading."""
    compressor.reset_counters()
    with compressor.active():
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return compressor
