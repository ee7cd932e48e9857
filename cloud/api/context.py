"""Typed application keys: the shared state a route handler may use, created by ``build_app``."""

from __future__ import annotations

from aiohttp import web

from cloud.config import CloudConfig
from cloud.metrics import CloudMetrics
from cloud.store.writer import AsyncStoreWriter

CONFIG = web.AppKey("config", CloudConfig)
METRICS = web.AppKey("metrics", CloudMetrics)
STORE = web.AppKey("store", AsyncStoreWriter)
