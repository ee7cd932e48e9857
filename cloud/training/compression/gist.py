"""Gist (ISCA'18) layer-pair encodings, chosen by a ``torch.fx`` pass over the model.

- ReLU -> MaxPool2d (non-overlapping windows): **binarize**. The pair becomes one module whose
  backward keeps only a 1-bit "ReLU output > 0" mask and the pool's argmax as a position inside
  its window (log2(kh*kw) bits), instead of the fp32 ReLU output and int64 pool indices. Lossless.
- ReLU -> Conv/Linear: **sparse storage, dense compute (SSDC)**. The ReLU output (saved by both
  layers) is stored as bitmask + non-zero values when that is smaller than the alternative.
  Lossless; applied by ``ActivationCompressor`` for the layers the plan lists.
- Anything else: **delayed precision reduction (DPR)**: the layer's BFP format from the policy,
  applied after the forward used the full-precision value (the saved-tensor hooks do exactly that).

Invariant: with DPR off (policy fp32), gradients through the transformed module are bit-identical
to the original's (``torch.equal``), because the binarized backward reproduces PyTorch's
``threshold_backward`` (``result <= 0 -> 0``) and max-pool scatter exactly.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.fx
from torch import nn
from torch.nn import functional as F

from models.numerics import pack_bits, unpack_bits

BINARIZE, SSDC, DPR = "binarize", "ssdc", "dpr"
_DENSE_CONSUMERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


@dataclass(frozen=True)
class GistPair:
    producer: str
    consumer: str
    encoding: str

    def __str__(self) -> str:
        return f"{self.producer}->{self.consumer}:{self.encoding}"


@dataclass(frozen=True)
class GistPlan:
    pairs: tuple[GistPair, ...]

    @property
    def ssdc_layers(self) -> frozenset[str]:
        return frozenset(p.producer for p in self.pairs if p.encoding == SSDC)

    def __str__(self) -> str:
        return ", ".join(map(str, self.pairs)) or "(no pairs)"


def _pair(value: int | tuple[int, ...]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def binarizable(pool: nn.MaxPool2d) -> bool:
    """Non-overlapping, unpadded, undilated windows: each input feeds at most one output."""
    kernel = _pair(pool.kernel_size)
    stride = _pair(pool.stride if pool.stride is not None else pool.kernel_size)
    return (kernel == stride and _pair(pool.padding) == (0, 0) and _pair(pool.dilation) == (1, 1)
            and not pool.ceil_mode and not pool.return_indices)


@functools.lru_cache(maxsize=64)
def _window_tables(h: int, w: int,
                   kernel: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For disjoint kh x kw windows over an h x w plane: the flat index of each window's corner
    (out_h, out_w), the in-window position of each offset from the corner (uint8, indexed by
    ``index - corner``), and the inverse: the offset of each in-window position (int64)."""
    kh, kw = kernel
    out_h, out_w = h // kh, w // kw
    corner = (torch.arange(out_h).view(-1, 1) * kh * w + torch.arange(out_w).view(1, -1) * kw)
    offsets = torch.tensor([r * w + c for r in range(kh) for c in range(kw)], dtype=torch.int64)
    position = torch.zeros((kh - 1) * w + kw, dtype=torch.uint8)
    position[offsets] = torch.arange(kh * kw, dtype=torch.uint8)
    return corner, position, offsets


class _ReluMaxPoolBinarized(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, kernel: tuple[int, int]) -> torch.Tensor:
        y = torch.relu(x)
        pooled, indices = F.max_pool2d(y, kernel, kernel, return_indices=True)
        n, c, h, w = y.shape
        corner, position, _ = _window_tables(h, w, kernel)
        # Position of the argmax inside its window: a table lookup on (index - window corner).
        local = position.index_select(0, indices.sub_(corner).view(-1))
        bits = max(1, math.ceil(math.log2(kernel[0] * kernel[1])))
        ctx.meta = (tuple(y.shape), tuple(pooled.shape), kernel, bits, x.dtype)
        # Not "y > 0": threshold_backward zeroes where result <= 0, so a NaN result passes its gradient.
        if y.device.type == "cpu":
            passes = torch.from_numpy(np.packbits(~(y.numpy() <= 0), bitorder="little"))
        else:
            passes = pack_bits(~(y <= 0), 1)
        ctx.save_for_backward(passes, pack_bits(local, bits))
        return pooled

    @staticmethod
    def backward(ctx, grad_pooled: torch.Tensor) -> tuple[torch.Tensor, None]:
        mask_packed, local_packed = ctx.saved_tensors
        shape, pooled_shape, kernel, bits, dtype = ctx.meta
        n, c, h, w = shape
        corner, _, offsets = _window_tables(h, w, kernel)
        local = unpack_bits(local_packed, bits, math.prod(pooled_shape)).to(torch.int32)
        indices = offsets.to(grad_pooled.device).index_select(0, local).view(pooled_shape)
        indices.add_(corner.to(grad_pooled.device))
        # The very kernel max_pool2d's own backward runs: bit-identical gradients.
        grad_y = torch.ops.aten.max_pool2d_with_indices_backward(
            grad_pooled, grad_pooled.new_empty(shape), list(kernel), list(kernel), [0, 0], [1, 1], False,
            indices)
        passes = unpack_bits(mask_packed, 1, n * c * h * w)
        if grad_y.dtype == torch.float32 and grad_y.is_contiguous():
            # threshold_backward's "result <= 0 -> 0" as a bitwise AND with 0 or ~0: exact, branch-free.
            grad_y.view(torch.int32).view(-1).bitwise_and_(passes.to(torch.int32).neg_())
        else:
            grad_y.masked_fill_(passes.view(shape) == 0, 0)
        return grad_y, None


class ReluMaxPoolBinarized(nn.Module):
    """ReLU followed by a non-overlapping MaxPool2d, storing 1 bit + the window argmax for backward."""

    def __init__(self, pool: nn.MaxPool2d) -> None:
        super().__init__()
        if not binarizable(pool):
            raise ValueError(f"{pool} has overlapping or padded windows; binarize needs them disjoint")
        self.kernel = _pair(pool.kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or not torch.is_grad_enabled() or not x.requires_grad:
            return F.max_pool2d(torch.relu(x), self.kernel, self.kernel)
        return _ReluMaxPoolBinarized.apply(x, self.kernel)

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}"


def _is_relu(node: torch.fx.Node, modules: dict[str, nn.Module]) -> bool:
    if node.op == "call_module":
        return isinstance(modules[node.target], nn.ReLU)
    return node.op == "call_function" and node.target in (torch.relu, F.relu)


def _consumer_module(node: torch.fx.Node, modules: dict[str, nn.Module]) -> nn.Module | None:
    return modules[node.target] if node.op == "call_module" else None


def gist_transform(model: nn.Module, *, binarize: bool = True, ssdc: bool = True
                   ) -> tuple[torch.fx.GraphModule, GistPlan]:
    """Trace ``model`` and return (transformed module sharing its parameters, plan).

    Layer names in the plan and the result are the original module names, so a ``LayerPolicy``
    written for the model applies unchanged.
    """
    traced = torch.fx.symbolic_trace(model)
    modules = dict(traced.named_modules())
    pairs: list[GistPair] = []
    for node in list(traced.graph.nodes):
        if not _is_relu(node, modules):
            continue
        producer = str(node.target) if node.op == "call_module" else node.name
        users = list(node.users)
        consumer_modules = [_consumer_module(user, modules) for user in users]
        if (binarize and node.op == "call_module" and len(users) == 1
                and isinstance(consumer_modules[0], nn.MaxPool2d) and binarizable(consumer_modules[0])):
            pool_node = users[0]
            fused_name = f"gist_{producer}_{pool_node.target}".replace(".", "_")
            traced.add_submodule(fused_name, ReluMaxPoolBinarized(consumer_modules[0]))
            with traced.graph.inserting_after(pool_node):
                fused = traced.graph.call_module(fused_name, args=node.args)
            pool_node.replace_all_uses_with(fused)
            traced.graph.erase_node(pool_node)
            traced.graph.erase_node(node)
            pairs.append(GistPair(producer, str(pool_node.target), BINARIZE))
        elif (ssdc and node.op == "call_module" and users
              and all(isinstance(m, _DENSE_CONSUMERS) for m in consumer_modules)):
            pairs.append(GistPair(producer, ",".join(str(u.target) for u in users), SSDC))
        else:
            pairs.append(GistPair(producer, ",".join(u.name for u in users), DPR))
    traced.graph.lint()
    traced.recompile()
    traced.delete_all_unused_submodules()
    return traced, GistPlan(tuple(pairs))
