"""Activation compression for training: saved-for-backward tensors stored in block floating point
(``models.numerics``) through autograd's saved-tensor hooks, Gist layer-pair encodings chosen by a
``torch.fx`` pass, and an adaptive controller that moves each layer's format along a ladder.

Invariant: compression never changes the forward pass; it only changes what backward reads, and
the lossless encodings (Gist binarize and sparse) change nothing at all.
"""

from cloud.training.compression.controller import (
    DEFAULT_LADDER,
    AdaptiveController,
    ControllerSettings,
    Decision,
    propagating_layers,
)
from cloud.training.compression.gist import GistPair, GistPlan, ReluMaxPoolBinarized, gist_transform
from cloud.training.compression.hooks import ActivationCompressor, LayerBytes, leaf_names
from cloud.training.compression.layer_formats import LayerPolicy
from cloud.training.compression.recompute import RecomputedLayer, recompute_recurrent
from cloud.training.compression.step_bypass import OUTSIDE_LAYERS
from cloud.training.compression.trainer import (
    TrainResult,
    count_saved_bytes,
    fit_compressed,
    shuffled_batches,
    train_compressed,
)

__all__ = [
    "DEFAULT_LADDER",
    "OUTSIDE_LAYERS",
    "ActivationCompressor",
    "AdaptiveController",
    "ControllerSettings",
    "Decision",
    "GistPair",
    "GistPlan",
    "LayerBytes",
    "LayerPolicy",
    "RecomputedLayer",
    "ReluMaxPoolBinarized",
    "TrainResult",
    "count_saved_bytes",
    "fit_compressed",
    "gist_transform",
    "leaf_names",
    "propagating_layers",
    "recompute_recurrent",
    "shuffled_batches",
    "train_compressed",
]
