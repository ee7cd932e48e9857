"""The model registry in cloudd: ``cloud.registry``'s routes behind the operator token.

    GET  /v1/models[?name=N]       {"models": [entry, ...]}, each with its "lineage"  (open: gateways poll it)
    POST /v1/models/{name}         operator token (401/403 otherwise); see cloud/registry.py
    GET  /v1/models/{name}/{version}[/onnx]   as cloud/registry.py

A version's lineage (which dataset, gateways and LSN ranges, or which job) is the
``notes["lineage"]`` of its metadata, written by the job that produced it; versions uploaded by
hand have ``lineage: null``.

The registry copies the lineage into each version's entry when it stores it.
"""

from __future__ import annotations

from aiohttp import web

from cloud.api.auth import operator_refusal
from cloud.api.context import CONFIG, REGISTRY
from cloud.registry import setup_model_routes


def setup(app: web.Application) -> None:
    app[REGISTRY] = setup_model_routes(app, app[CONFIG].data_dir, operator_refusal)
