"""The running step's side of the bypass (bypass.py): the plans learned so far, the one the step
follows, and the per-layer forward hooks and stack that tell the pack hook which layer is running.

A step either follows a plan learned for its input shapes or keeps full bookkeeping and records a
``Learning`` (``begin``); the model's forward pre-hook switches mid-step when the inputs' shapes
differ (``note_inputs``). At the step's end (``end``) a learned plan is kept under its input shapes,
at most ``PLANS_KEPT`` of them (more shapes than this: start again); ``forget`` drops them all,
and so does ``use_policy`` with a new policy.

The per-layer forward hooks are registered on the first step and stay (they only record while
``recording``; a bypassed layer's are removed until a learning step needs them): registering them
per step cost about a millisecond.

Invariant: while recording, ``frame()`` is the frame of the innermost hooked layer call still
running (``BYPASS`` for a layer the step's plan bypasses), or the outside frame when none is; each
frame pushed is popped once and its groups are closed once (at the layer's return, or ``unwind``);
the layers with forward hooks are the leaves not in the step's plan's ``unhooked``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from cloud.training.compression.bypass import BypassPlan, Learning, Signature, learned_plan
from cloud.training.compression.groups import SavedGroup
from cloud.training.compression.layer_formats import LayerPolicy

OUTSIDE_LAYERS = "<outside>"  # saved by ops that run outside any leaf module (e.g. the loss)
PLANS_KEPT = 8  # bypass plans, one per input shapes seen; more shapes than this: start again
Groups = dict[torch.dtype, SavedGroup]
Counted = dict[str, tuple[int, int, int]]  # each layer's counters: (original, stored, tensors)
Frame = tuple[str, Groups]  # a running layer and the groups its call gathers
BYPASS: Frame = ("<bypassed>", {})  # on the layer stack (and as the outside frame): return at once


class StepBypass:
    """Owns the per-layer forward hooks of one model's leaves and the plans learned for it.

    ``counted`` reads the compressor's counters (a learning step compares them before and after);
    ``close_groups`` encodes (and counts) the groups of a frame that is popped."""

    def __init__(
        self,
        leaves: list[tuple[str, nn.Module]],
        policy: LayerPolicy,
        *,
        counted: Callable[[], Counted],
        close_groups: Callable[[Groups], None],
    ) -> None:
        self._leaves = leaves
        self._policy = policy  # what a learning step learns under
        self._counted = counted
        self._close_groups = close_groups
        self._plans: dict[Signature, BypassPlan] = {}  # learned, per input shapes (a few at most)
        self._last_signature: Signature | None = None  # the inputs of the last step
        self.plan: BypassPlan | None = None  # the plan the running step follows
        self.learning: Learning | None = None  # what the running full step records for a plan
        self.recording = False  # the layer hooks push and pop frames only while recording
        self._stack: list[Frame] = []
        self._outside: Groups = {}
        self._outside_frame: Frame = (OUTSIDE_LAYERS, self._outside)
        self._layer_hooks: dict[str, tuple[RemovableHandle, RemovableHandle]] = {}  # (pre, post) per layer
        self._unhooked: frozenset[str] | None = None  # layers without hooks now (None: not set up)

    # Plans -------------------------------------------------------------------------------------

    def last_plan(self) -> BypassPlan | None:
        """The plan learned for the last step's input shapes, if any (the next step's, most likely)."""
        return None if self._last_signature is None else self._plans.get(self._last_signature)

    @property
    def policy(self) -> LayerPolicy:
        return self._policy

    def forget(self) -> None:
        """Drop the learned plans: the next step learns one again."""
        self._plans.clear()

    def use_policy(self, policy: LayerPolicy) -> None:
        """Learn under ``policy`` from the next step on; drop the learned plans if one was learned
        under another (a layer's format may have changed what it encodes)."""
        self._policy = policy
        if any(plan.policy != policy for plan in self._plans.values()):
            self._plans.clear()

    def begin(self, plan: BypassPlan | None) -> None:
        """Follow ``plan``, or (``None``) keep full bookkeeping and learn a plan from now on."""
        self.plan = plan
        if plan is None:
            self.learning = Learning(self._policy, counted_before=self._counted())
            self._outside_frame = (OUTSIDE_LAYERS, self._outside)
            self._hook_layers(frozenset())
        else:
            self.learning = None
            bypass_outside = OUTSIDE_LAYERS in plan.bypassed
            self._outside_frame = BYPASS if bypass_outside else (OUTSIDE_LAYERS, self._outside)
            self._hook_layers(plan.unhooked)

    def note_inputs(self, signature: Signature) -> bool:
        """The model's inputs, from its forward pre-hook. Returns whether the step, which followed a
        plan without saved-tensor hooks, needs them from now on."""
        plan = self.plan
        needs_saved_hooks = False
        if plan is not None and plan.signature != signature:
            # Inputs of other shapes may save other tensors: follow their own plan (an epoch's
            # last, smaller batch) or learn one, from this forward on.
            other = self._plans.get(signature)
            self.begin(other)
            needs_saved_hooks = plan.no_saved_hooks and (other is None or not other.no_saved_hooks)
        if self.learning is not None and self.learning.signature is None:
            self.learning.signature = signature
        return needs_saved_hooks

    def end(self) -> None:
        """End the step: keep the plan a learning step supports."""
        plan, learning = self.plan, self.learning
        if plan is not None:
            self._last_signature = plan.signature
        elif learning is not None:
            learned = learned_plan(learning, self._counted(), OUTSIDE_LAYERS)
            if learned is not None:
                if len(self._plans) >= PLANS_KEPT:
                    self._plans.clear()
                self._plans[learned.signature] = learned
                self._last_signature = learned.signature
        self.plan = self.learning = None

    # Layer stack -------------------------------------------------------------------------------

    def frame(self) -> Frame:
        """Where the pack hook files a tensor saved now."""
        return self._stack[-1] if self._stack else self._outside_frame

    def unwind(self) -> None:
        """Pop the frames of layer calls still open, then close the outside frame's groups."""
        while self._stack:
            frame = self._stack.pop()
            if frame is not BYPASS:
                self._close_groups(frame[1])
        self._close_groups(self._outside)

    def remove_hooks(self) -> None:
        for handles in self._layer_hooks.values():
            for handle in handles:
                handle.remove()
        self._layer_hooks.clear()
        self._unhooked = None

    def _hook_layers(self, unhooked: frozenset[str]) -> None:
        """Register the forward hooks of every layer not in ``unhooked``; remove the others'."""
        if unhooked == self._unhooked:
            return
        for name, module in self._leaves:
            handles = self._layer_hooks.get(name)
            if name in unhooked and handles is not None:
                for handle in handles:
                    handle.remove()
                del self._layer_hooks[name]
            elif name not in unhooked and handles is None:
                self._layer_hooks[name] = (
                    module.register_forward_pre_hook(self._enter_layer(name)),
                    module.register_forward_hook(self._leave_layer, always_call=True),
                )
        self._unhooked = unhooked

    def _enter_layer(self, name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            if not self.recording:
                return
            plan = self.plan
            if plan is not None and name in plan.bypassed:
                self._stack.append(BYPASS)
                return
            if self.learning is not None and self._stack:
                self.learning.nested.add(name)
            self._stack.append((name, {}))

        return hook

    def _leave_layer(self, module: nn.Module, args: tuple, output: object) -> None:
        if self.recording and self._stack:
            frame = self._stack.pop()
            if frame is not BYPASS:
                self._close_groups(frame[1])
