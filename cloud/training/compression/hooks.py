"""Activations saved for backward, stored compressed: ``torch.autograd.graph.saved_tensors_hooks``.

While ``ActivationCompressor.active()`` is entered, every tensor autograd saves goes through the
pack hook, which knows the layer whose forward is running and stores the tensor with that layer's
format: BFP (lossy), Gist sparse form (lossless, for layers the Gist pass marked and when it is
smaller), or as-is. The unpack hook decodes it in backward.

- **One encode per layer call**: the floating tensors a layer's call saves for BFP are gathered
  and, when the call returns, encoded together as one buffer (each tensor padded to whole blocks,
  so no block mixes two tensors), decoded together by the first unpack in backward. A GRU's call
  saves ~400 small tensors per step (one set per time step): encoded one by one, each paid the
  codec's fixed cost (op dispatch, ~20 us); as one group they pay it once. Tensors saved by ops
  outside any layer (the loss) are gathered until ``active()`` exits.
- **Size threshold** ``min_numel``, one for every encoding the hooks choose: a group smaller than
  this, a dropout mask with fewer elements (or fewer than 64) and a Gist sparse candidate smaller
  than it are kept as they are (counted). Default ``None``: measured once per process and device
  (``measured_min_numel``): the group size at which the BFP codec's fixed cost per call equals its
  cost per element, so that a group encoded runs at least at half the codec's throughput on large
  tensors. The mask packer's own break-even by the same fit is higher (~40 Ki elements; the
  codec's measured 20-40 Ki on the loaded dev VM); one threshold keeps "does this layer encode anything" a
  question of shapes alone, which the bypass below relies on.
- **Layers with nothing to encode are bypassed** (bypass.py, step_bypass.py): the first step under
  a policy (and after ``reset_counters`` or a change of the model's input shapes) keeps full
  bookkeeping and learns which layers encoded nothing; from the next step on, their tensors go to
  autograd as they are, their forward hooks are removed where that is safe, and when no layer
  encodes anything the saved-tensor hooks are not entered at all (the step runs as fp32 does).
- Parameters and views of them (same storage), and any other leaf that requires grad (stashed
  weight versions, a pipeline stage's received input), are returned untouched and not counted:
  they are not activations the hooks could free, their owner keeps them alive anyway.
- The model's own inputs (the batch, found by a forward pre-hook on the model) are kept as they
  are (counted): the caller holds the batch through backward, so an encoded copy would add
  memory, not save it.
- Dropout masks (bool tensors, and the float mask of 0 and 1/(1-p) a CPU ``nn.Dropout`` saves)
  of at least ``min_numel`` elements are stored as one bit per element plus the one non-zero
  value (lossless); other non-float tensors (max-pool indices, Gist codes) are kept as they are;
  both counted.
- A tensor saved by two ops (a ReLU's output is saved by the ReLU and by the next conv) is stored
  once and shared; the cache holds only weak references, so it never keeps memory alive. Its
  decoded form is shared too: a group's decoded buffer is kept until the last of its users has
  unpacked (fp32 keeps the originals alive that long anyway), so backward decodes it once.
- The per-layer forward hooks that tell the pack hook which layer is running (step_bypass.py) are
  registered on the first ``active()`` and stay.

Invariant: ``counters[layer].stored`` is the sum of the real bytes held for backward by that
layer's saved tensors (each distinct tensor counted once; a bypassed layer's, as-is, are the bytes
its learning step counted, bypass.py), and ``live_bytes`` (the bytes the hooks' own objects hold,
not bypassed tensors, which autograd holds as fp32 would) returns to zero once the autograd graph
that holds them is freed. A step right after ``reset_counters`` keeps full bookkeeping, so that one
counted step (``count_saved_bytes``) sees every tensor in ``peak_live_bytes`` too.
"""

from __future__ import annotations

import contextlib
import math
import time
import weakref
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from cloud.training.compression.bypass import input_signature
from cloud.training.compression.groups import GroupSlot, SavedGroup, measured_min_numel
from cloud.training.compression.layer_formats import LayerPolicy
from cloud.training.compression.sparse import count_nonzero_bits, encode_sparse
from cloud.training.compression.step_bypass import BYPASS, OUTSIDE_LAYERS, Counted, Groups, StepBypass
from cloud.training.compression.stored import Stored, StoredKind, as_bits, tensor_nbytes
from models.numerics import (
    BfpCodec,
    BfpFormat,
    error_stats,
    packed_nbytes,
)

_CACHE_PRUNE_AT = 1024


@dataclass
class LayerBytes:
    original: int = 0
    stored: int = 0
    tensors: int = 0


def _relative_error(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """||approx - reference|| / ||reference||: two float32 passes; float64 ``error_stats`` only when
    the norm is not finite (non-finite elements, or overflow)."""
    norm = float(torch.linalg.vector_norm(reference))
    if math.isfinite(norm) and norm > 0:
        return float(torch.dist(approx, reference)) / norm
    return error_stats(reference, approx).relative_error


def leaf_names(module: nn.Module) -> list[str]:
    """Names of the layers the hooks attribute saved tensors to: the leaf modules (no children),
    and modules that own parameters directly (``nn.MultiheadAttention``, whose projections run as
    functions inside its own forward, not as calls of its children)."""
    return [
        name
        for name, m in module.named_modules()
        if name and (not any(True for _ in m.children()) or any(True for _ in m.parameters(recurse=False)))
    ]


class ActivationCompressor:
    """Owns the hooks for one model. Not thread-safe: one forward/backward at a time per instance."""

    def __init__(
        self,
        model: nn.Module,
        policy: LayerPolicy,
        *,
        ssdc_layers: Collection[str] = (),
        generator: torch.Generator | None = None,
        min_numel: int | None = None,
        mask_bits: bool = True,
    ) -> None:
        """``min_numel``: groups (one layer call's tensors) smaller than this stay as they are;
        ``None``: ``measured_min_numel`` for the model's device, measured on the first ``active()``.
        ``mask_bits``: store dropout masks as bits (False: as they are, to count fp32's bytes)."""
        self.model = model
        leaves = [(name, model.get_submodule(name)) for name in leaf_names(model)]
        # The policy, the bypass plans learned under it, the layer hooks and stack.
        self._bypass = StepBypass(leaves, policy, counted=self._counted, close_groups=self._close_groups)
        self.ssdc_layers = frozenset(ssdc_layers)
        self.generator = generator
        self.min_numel = min_numel
        self.measure_errors = False
        self.layer_errors: dict[str, float] = {}
        self.counters: dict[str, LayerBytes] = {}
        self.kinds: dict[StoredKind, int] = {"raw": 0, "bfp": 0, "sparse": 0, "bits": 0}
        self.live_bytes = 0
        self.peak_live_bytes = 0
        # CPU seconds spent encoding (at each group's close) and decoding since reset_counters.
        self.encode_s = 0.0
        self.decode_s = 0.0
        self._dropout_layers = {name for name, m in leaves if type(m) is nn.Dropout}
        self.mask_bits = mask_bits
        self._model_hook: RemovableHandle | None = None  # the model's pre-hook (notes its inputs)
        self._saved_hooks: contextlib.ExitStack | None = None  # while active(): where they are entered
        self._params = list(model.parameters())
        self._input_storages: set[int] = set()
        self._cache: dict[tuple, tuple[weakref.ref, weakref.ref, str]] = {}  # key -> (source, stored, layer)
        self._codecs: dict[BfpFormat, BfpCodec] = {}
        self._param_storages: set[int] = set()
        self._formats: dict[str, BfpFormat | None] = {}  # layer -> format, filled as layers save tensors

    @property
    def policy(self) -> LayerPolicy:
        return self._bypass.policy

    @policy.setter
    def policy(self, policy: LayerPolicy) -> None:
        self._formats = {}
        self._bypass.use_policy(policy)

    def reset_counters(self) -> None:
        """Zero the counters; the next step keeps full bookkeeping (every tensor in live_bytes)."""
        self._bypass.forget()
        self.counters.clear()
        self.kinds = dict.fromkeys(self.kinds, 0)
        self.layer_errors.clear()
        self.peak_live_bytes = self.live_bytes
        self.encode_s = self.decode_s = 0.0

    def total(self) -> LayerBytes:
        total = LayerBytes()
        for entry in self.counters.values():
            total.original += entry.original
            total.stored += entry.stored
            total.tensors += entry.tensors
        return total

    @contextlib.contextmanager
    def active(self) -> Iterator[ActivationCompressor]:
        self._param_storages = {p.untyped_storage().data_ptr() for p in self._params}
        if self.min_numel is None:
            device = self._params[0].device.type if self._params else "cpu"
            self.min_numel = measured_min_numel(device)
        if self._model_hook is None:
            self._model_hook = self.model.register_forward_pre_hook(self._note_inputs)
        plan = self._bypass.last_plan()
        self._bypass.begin(plan)
        self._bypass.recording = True
        try:
            with contextlib.ExitStack() as saved_hooks:
                self._saved_hooks = saved_hooks
                if plan is None or not plan.no_saved_hooks:
                    self._enter_saved_hooks()
                yield self
        finally:
            self._bypass.recording = False
            self._saved_hooks = None
            self._bypass.unwind()
            self._cache.clear()
            self._input_storages.clear()
            self._end_step()

    def remove_hooks(self) -> None:
        """Detach the model's and the per-layer hooks (``active()`` registers them again)."""
        if self._model_hook is not None:
            self._model_hook.remove()
            self._model_hook = None
        self._bypass.remove_hooks()

    def next_step_is_exact(self) -> bool:
        """Whether a step on inputs shaped like the last one is exactly the fp32 step: its learned
        plan encodes nothing, and by size alone (every layer the policy names has a format, so no
        choice of formats would encode more). A full-precision probe of such a step would measure
        no error; the adaptive trainer skips it (and the policy moves that would follow, each of
        which makes the next step learn its plan again)."""
        plan = self._bypass.last_plan()
        return (
            plan is not None
            and plan.no_saved_hooks
            and all(fmt is not None for _, fmt in self.policy.per_layer)
        )

    # Bypass (bypass.py, step_bypass.py) -------------------------------------------------------

    def _enter_saved_hooks(self) -> None:
        assert self._saved_hooks is not None, "only while active()"
        self._saved_hooks.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack))

    def _counted(self) -> Counted:
        """Each layer's counters as (original, stored, tensors): what a learning step compares."""
        return {layer: (e.original, e.stored, e.tensors) for layer, e in self.counters.items()}

    def _end_step(self) -> None:
        plan = self._bypass.plan
        if plan is not None:  # the bypassed layers' bytes, as their learning step counted them
            for layer, original, stored, tensors in plan.per_step:
                entry = self.counters.setdefault(layer, LayerBytes())
                entry.original += original
                entry.stored += stored
                entry.tensors += tensors
                self.kinds["raw"] += tensors
        self._bypass.end()

    # Hooks -------------------------------------------------------------------------------------

    def _note_inputs(self, module: nn.Module, args: tuple) -> None:
        if not self._bypass.recording:
            return
        if self._bypass.note_inputs(input_signature(args)) and self._saved_hooks is not None:
            self._enter_saved_hooks()
        self._input_storages.update(
            a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)
        )

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor | Stored | GroupSlot:
        frame = self._bypass.frame()
        if frame is BYPASS:  # a layer with nothing to encode (bypass.py)
            return tensor
        layer, groups = frame
        learning = self._bypass.learning
        if learning is not None:
            learning.seen.add(layer)
        # Leaves that require grad (parameters, stashed weight versions, a pipeline stage's
        # received input) are held alive by their owner: encoding them would save nothing.
        if tensor.requires_grad and tensor.grad_fn is None:
            return tensor
        storage = tensor.untyped_storage().data_ptr()
        if storage in self._param_storages:
            return tensor
        key = (storage, tensor.storage_offset(), tensor.shape, tensor.stride(), tensor.dtype, tensor._version)
        cached = self._cache.get(key)
        if cached is not None:
            source, stored = cached[0](), cached[1]()
            # A live source with the same storage, view and version has the same bytes.
            if source is not None and stored is not None:
                if learning is not None and cached[2] != layer:
                    learning.shared.add((cached[2], layer))
                if isinstance(stored, GroupSlot):
                    stored.group.users += 1
                else:
                    stored.users += 1
                return stored
        entry = self.counters.setdefault(layer, LayerBytes())
        entry.original += tensor_nbytes(tensor)
        entry.tensors += 1
        if storage in self._input_storages:
            packed: Stored | GroupSlot = Stored("raw", tensor, tensor_nbytes(tensor))
        else:
            packed = self._encode(tensor, layer, groups)
        if len(self._cache) >= _CACHE_PRUNE_AT:
            self._cache = {k: v for k, v in self._cache.items() if v[0]() is not None and v[1]() is not None}
        self._cache[key] = (weakref.ref(tensor), weakref.ref(packed), layer)
        if isinstance(packed, Stored):  # a group's bytes are counted when it closes
            entry.stored += packed.nbytes
            self.kinds[packed.kind] += 1
            self._hold(packed, packed.nbytes)
            if learning is not None and packed.kind != "raw":
                learning.encoded.add(layer)
        return packed

    def _hold(self, stored: Stored | SavedGroup, nbytes: int) -> None:
        self.live_bytes += nbytes
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        stored.owner = self

    def _unpack(self, stored: torch.Tensor | Stored | GroupSlot) -> torch.Tensor:
        if isinstance(stored, torch.Tensor):
            return stored
        if isinstance(stored, GroupSlot):
            group = stored.group
            started = time.process_time() if group.views is None and group.packed is not None else None
            tensor = group.get(stored.index, self._codec(group.fmt) if group.packed is not None else None)
            if started is not None:
                self.decode_s += time.process_time() - started
            return tensor
        if stored.kind == "sparse" and stored.decoded is None:
            started = time.process_time()
            tensor = stored.unpack()
            self.decode_s += time.process_time() - started
            return tensor
        return stored.unpack()

    # Encoding choice ---------------------------------------------------------------------------

    def _format(self, layer: str) -> BfpFormat | None:
        if layer not in self._formats:
            # Ops outside any layer (the loss) are compressed only when the policy names them:
            # the loss's saved log-probabilities are tiny and very sensitive.
            named = layer != OUTSIDE_LAYERS or self.policy.names(layer)
            self._formats[layer] = self.policy.format_for(layer) if named else None
        return self._formats[layer]

    def _encode(self, tensor: torch.Tensor, layer: str, groups: Groups) -> Stored | GroupSlot:
        if (
            self.mask_bits
            and tensor.numel() >= max(64, self.min_numel or 0)
            and (tensor.dtype == torch.bool or layer in self._dropout_layers)
        ):
            mask = as_bits(tensor, layer in self._dropout_layers)  # a dropout mask: one bit each, lossless
            if mask is not None:
                return mask
        if not tensor.is_floating_point():
            return Stored("raw", tensor, tensor_nbytes(tensor))
        fmt = self._format(layer)
        if layer in self.ssdc_layers and tensor.numel() >= (self.min_numel or 0):
            learning = self._bypass.learning
            if learning is not None:  # sparse or not depends on the values: never bypassed
                learning.encoded.add(layer)
            n, itemsize = tensor.numel(), tensor.element_size()
            sparse_bytes = math.ceil(n / 8) + count_nonzero_bits(tensor) * itemsize
            dense_bytes = (
                tensor_nbytes(tensor)
                if fmt is None
                else packed_nbytes(n, fmt, int(fmt.outlier_fraction * n), itemsize)
            )
            if sparse_bytes < dense_bytes:  # Gist: sparse only when sparsity is high enough to pay
                started = time.process_time()
                sparse = encode_sparse(tensor)
                self.encode_s += time.process_time() - started
                return Stored("sparse", sparse, sparse.nbytes)
        if fmt is None:
            return Stored("raw", tensor, tensor_nbytes(tensor))
        group = groups.get(tensor.dtype)
        if group is None:
            group = groups[tensor.dtype] = SavedGroup(layer, fmt)
        return GroupSlot(group, group.add(tensor))

    def _close_groups(self, groups: Groups) -> None:
        """Encode each group a layer call gathered (one encode per group), or keep it raw when it is
        smaller than ``min_numel``; count its bytes."""
        for group in groups.values():
            tensors = group.tensors or []
            original = sum(tensor_nbytes(t) for t in tensors)
            encode = group.numel >= (self.min_numel or 0)
            codec = self._codec(group.fmt) if encode else None
            started = time.process_time() if encode else 0.0  # a raw group costs no clock read
            group.close(codec, original)
            if codec is not None and self.measure_errors:
                # The probe's decode is the one backward would make: keep it for backward (probe
                # steps hold the decoded buffer from forward on, as fp32 would hold the originals).
                reference = torch.cat([t.detach().reshape(-1) for t in tensors])
                approx = torch.cat([t.reshape(-1) for t in group.decode_with(codec)])
                error = _relative_error(reference, approx)
                self.layer_errors[group.layer] = max(error, self.layer_errors.get(group.layer, 0.0))
            if encode:
                self.encode_s += time.process_time() - started
                learning = self._bypass.learning
                if learning is not None:
                    learning.encoded.add(group.layer)
            self.counters[group.layer].stored += group.nbytes
            self.kinds["bfp" if encode else "raw"] += 1 if encode else len(tensors)
            self._hold(group, group.nbytes)
        groups.clear()

    def _codec(self, fmt: BfpFormat) -> BfpCodec:
        codec = self._codecs.get(fmt)
        if codec is None:
            codec = self._codecs[fmt] = BfpCodec(fmt, self.generator, use_kernels=True)
        return codec
