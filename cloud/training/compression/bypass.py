"""Which layers the saved-tensor hooks can leave alone: learned from one step with full bookkeeping.

A layer whose calls have nothing to encode (every group below ``min_numel``, no mask large enough
to pack as bits, no Gist sparse form, or the fp32 format) still paid the hooks' Python on every
saved tensor (the shared-tensor cache's key and weak references, the counters: ~25 us each). On a
1 ms MLP step with twelve such tensors that was a third of the step. So the compressor runs one
step with full bookkeeping (a *learning* step), records what each layer encoded, and from the next
step on *bypasses* the layers that encoded nothing: their forward hooks are removed (or, when they
cannot be, they mark the layer stack so that the pack hook returns at once), the pack hook hands
their tensors to autograd as they are, and when nothing in the whole step encodes anything, the
saved-tensor hooks are not entered at all.

A layer is bypassed only if, in the learning step, it was called, encoded nothing, had no tensor
large enough to be a Gist sparse (SSDC) candidate (whether the sparse form pays depends on the
values, not the shapes) and shares no saved tensor with a layer that is not bypassed (a ReLU's
output is also saved by the next layer: if only one of the two bypassed it, the tensor would be
kept raw and encoded, more than fp32 holds). Its forward hooks are removed only if it never ran
inside another hooked layer and ops outside layers are bypassed too (otherwise its tensors would
be attributed to something else).

A plan is learned per input shapes (the model's tensor inputs' shapes and dtypes: an epoch's
last, smaller batch has its own; the compressor keeps a few) and holds while the compressor's
policy is the one it was learned under and the counters have not been reset since; a change of
policy or ``reset_counters`` makes the next step a learning step again, and inputs of shapes
without a plan make the current one a learning step from the model's forward pre-hook on. Inputs
whose shapes change at every step therefore keep full bookkeeping at every step, as before.

Invariant: a bypassed step counts, for each bypassed layer, the bytes its learning step counted
(the same input shapes save the same tensors: its stored bytes equal its original bytes, nothing
is encoded); every other layer is counted as on a full step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from cloud.training.compression.layer_formats import LayerPolicy

Signature = tuple[tuple[torch.Size, torch.dtype], ...]  # the model's tensor inputs


def input_signature(args: tuple) -> Signature:
    return tuple((a.shape, a.dtype) for a in args if isinstance(a, torch.Tensor))


@dataclass
class Learning:
    """What a full-bookkeeping step records for the plan (the pack hook and layer hooks fill it)."""

    policy: LayerPolicy
    signature: Signature | None = None  # set by the model's forward pre-hook
    seen: set[str] = field(default_factory=set)  # layers that saved a tensor (cache hits too)
    encoded: set[str] = field(default_factory=set)  # layers that encoded anything (or may: SSDC)
    shared: set[tuple[str, str]] = field(default_factory=set)  # (packed by, reused by)
    nested: set[str] = field(default_factory=set)  # layers called while another layer was running
    counted_before: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # counters at start


@dataclass(frozen=True)
class BypassPlan:
    policy: LayerPolicy
    signature: Signature
    bypassed: frozenset[str]  # layers (OUTSIDE_LAYERS included) whose tensors go to autograd as-is
    unhooked: frozenset[str]  # bypassed layers whose forward hooks are removed
    no_saved_hooks: bool  # nothing in the step encodes: the saved-tensor hooks are not entered
    per_step: tuple[tuple[str, int, int, int], ...]  # (layer, original, stored, tensors) to count

    def holds(self, policy: LayerPolicy, signature: Signature) -> bool:
        return self.signature == signature and self.policy == policy


def learned_plan(
    learning: Learning,
    counted_after: Mapping[str, tuple[int, int, int]],
    outside: str,
) -> BypassPlan | None:
    """The plan a learning step supports (``None`` if the model's inputs were never seen)."""
    if learning.signature is None:
        return None
    bypassed = learning.seen - learning.encoded
    if outside not in learning.seen:  # nothing was saved outside layers: nothing to encode there
        bypassed.add(outside)
    changed = True
    while changed:  # a tensor shared across the line: both sides keep their bookkeeping
        changed = False
        for a, b in learning.shared:
            if (a in bypassed) != (b in bypassed):
                bypassed.discard(a)
                bypassed.discard(b)
                changed = True
    outside_bypassed = outside in bypassed
    unhooked = {layer for layer in bypassed if outside_bypassed and layer not in learning.nested}
    unhooked.discard(outside)
    per_step = []
    for layer in sorted(bypassed):
        before = learning.counted_before.get(layer, (0, 0, 0))
        after = counted_after.get(layer, (0, 0, 0))
        original, stored, tensors = (a - b for a, b in zip(after, before, strict=True))
        if tensors:
            per_step.append((layer, original, stored, tensors))
    return BypassPlan(
        policy=learning.policy,
        signature=learning.signature,
        bypassed=frozenset(bypassed),
        unhooked=frozenset(unhooked),
        no_saved_hooks=learning.seen <= bypassed,
        per_step=tuple(per_step),
    )
