"""Side storage of the BFP codec's torch path (``codec.py``): which elements leave the blocks.

Non-finite elements (and, for log levels, |x| >= 2**127) always; then the outlier budget
``k = floor(outlier_fraction * n)``, chosen by how large an element is relative to the mean
magnitude of its block, so one spike cannot flatten the rest of its block.

Invariant: the indices returned are sorted, unique and within the tensor's n elements, and the
block maxima returned are those of the blocks without the side entries, except outliers (their
codes clamp to the top code and decode overwrites them from side storage).
"""

from __future__ import annotations

import torch

from models.numerics.format import BfpFormat

_TINY = 1e-30


def side_indices(
    fmt: BfpFormat,
    special_at: float,
    blocks: torch.Tensor,
    magnitude: torch.Tensor,
    block_max: torch.Tensor,
    n: int,
    special: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted unique flat indices, block maxima without them). Non-finite elements (and, for
    log levels, |x| >= 2**127) plus the outlier budget k = floor(fraction * n), chosen by how
    large an element is relative to the mean magnitude of its block (so one spike cannot
    flatten the rest of its block). When k <= n_blocks: the largest element of each of the k
    blocks whose max/mean is highest (at most one outlier per block); otherwise the k elements
    with the highest |x|/mean. Zeroes the special entries in ``blocks`` (which must then be a
    copy) and ``magnitude``; outliers may stay: their codes clamp to the top code and decode
    overwrites them from side storage anyway."""
    parts = []
    if special:
        found = (~(magnitude.view(-1) < special_at)).nonzero().view(-1)  # NaN compares False
        parts.append(found)
        blocks.view(-1)[found] = 0.0
        magnitude.view(-1)[found] = 0.0
        block_max = magnitude.amax(dim=1)
    k = int(fmt.outlier_fraction * n)
    if k > 0:
        mean = magnitude.mean(dim=1).add_(_TINY)
        n_blocks = magnitude.shape[0]
        if k <= n_blocks:
            top_blocks = torch.topk(block_max / mean, k, sorted=False).indices
            rows = magnitude.index_select(0, top_blocks)
            # argmax of a row is a real element: padding is 0 and comes after the block's first
            # element, and argmax returns the first maximum.
            position = rows.argmax(dim=1, keepdim=True)
            outliers = torch.add(position.view(-1), top_blocks, alpha=fmt.block_size)
            # Only those blocks' maxima change; ``magnitude`` keeps the outliers (their codes
            # clamp to the top code and are never read).
            block_max.index_copy_(0, top_blocks, rows.scatter_(1, position, 0.0).amax(dim=1))
        else:
            score = (magnitude / mean[:, None]).view(-1)[:n]
            outliers = torch.topk(score, k, sorted=False).indices
            magnitude.view(-1)[outliers] = 0.0
            block_max = magnitude.amax(dim=1)
        parts.append(outliers)
    if not parts:
        return torch.zeros(0, dtype=torch.int64, device=blocks.device), block_max
    side = torch.unique(torch.cat(parts)) if len(parts) > 1 else torch.sort(parts[0]).values
    return side, block_max
