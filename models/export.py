"""ONNX export of a torch model with a dynamic batch axis, checked against torch with onnxruntime.

Uses the TorchScript exporter (``dynamo=False``): in torch 2.13 on CPU it needs no onnxscript,
and gives plain opset-17 graphs that onnxruntime runs on any provider.

Invariant: `export_artifact` returns an artifact only if onnxruntime's outputs on the check inputs
(several batch sizes) are within ``tolerance`` (default 1e-4, max abs) of torch's, relative to the
outputs' scale when it exceeds 1 (float32 rounding grows with magnitude: the logits of a diverged
model reach thousands, and differ by more than 1e-4 from rounding alone).
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from models.artifact import ArtifactError, ModelArtifact, build_metadata

OPSET = 17
TOLERANCE = 1e-4


def export_onnx(
    model: nn.Module, example: torch.Tensor, *, input_name: str = "input", output_name: str = "output"
) -> bytes:
    model.eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # legacy exporter chosen on purpose
        # torch annotates ``f`` as a path; the TorchScript exporter (dynamo=False) takes a file object too
        torch.onnx.export(
            model,
            (example,),
            buffer,  # type: ignore[arg-type]
            input_names=[input_name],
            output_names=[output_name],
            dynamic_axes={input_name: {0: "batch"}, output_name: {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    return buffer.getvalue()


def max_abs_diff(
    onnx_bytes: bytes, model: nn.Module, inputs: torch.Tensor, *, input_name: str = "input"
) -> float:
    """Largest |onnxruntime - torch| over ``inputs`` (one run per batch, batch sizes as given), divided
    by the largest |torch output| when that exceeds 1."""
    import onnxruntime as ort

    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    model.eval()
    with torch.no_grad():
        expected = model(inputs).numpy()
    got = session.run(None, {input_name: inputs.numpy()})[0]
    return float(np.abs(got - expected).max()) / max(1.0, float(np.abs(expected).max()))


def export_artifact(
    model: nn.Module,
    example: torch.Tensor,
    *,
    name: str,
    version: str,
    input_spec: dict[str, Any],
    postprocess: str,
    labels: list[str] | None = None,
    threshold: float | None = None,
    notes: dict[str, Any] | None = None,
    tolerance: float = TOLERANCE,
    seed: int = 0,
) -> ModelArtifact:
    """Export, check at batch sizes 1, 3 and 8 (random inputs shaped like ``example``), wrap."""
    input_name = input_spec.get("name", "input")
    onnx_bytes = export_onnx(model, example[:1], input_name=input_name)
    generator = torch.Generator().manual_seed(seed)
    worst = 0.0
    for batch in (1, 3, 8):
        inputs = torch.rand((batch, *example.shape[1:]), generator=generator, dtype=example.dtype)
        worst = max(worst, max_abs_diff(onnx_bytes, model, inputs, input_name=input_name))
    if worst > tolerance:
        raise ArtifactError("export_mismatch", f"onnxruntime differs from torch by {worst:.3g} > {tolerance}")
    metadata = build_metadata(
        onnx_bytes,
        name=name,
        version=version,
        input=input_spec,
        output_name="output",
        postprocess=postprocess,
        labels=labels or [],
        threshold=threshold,
        notes={**(notes or {}), "export_max_abs_diff": worst, "opset": OPSET},
    )
    return ModelArtifact(metadata, onnx_bytes)
