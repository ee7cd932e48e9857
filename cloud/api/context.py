"""Typed application keys: the shared state a route handler may use, created by ``build_app``."""

from __future__ import annotations

from aiohttp import web

from cloud.config import CloudConfig
from cloud.fleet import FleetView
from cloud.jobs.manager import JobManager
from cloud.jobs.uploads import UploadedDatasets
from cloud.metrics import CloudMetrics
from cloud.registry import ModelRegistry
from cloud.roles import Role
from cloud.rollout.controller import RolloutController
from cloud.store.writer import AsyncStoreWriter
from cloud.tasks.runner import TaskRunner

CONFIG = web.AppKey("config", CloudConfig)
METRICS = web.AppKey("metrics", CloudMetrics)
STORE = web.AppKey("store", AsyncStoreWriter)
# Set by the route groups that own them (cloud.api.registry, cloud.api.jobs, cloud.api.fleet).
REGISTRY = web.AppKey("registry", ModelRegistry)
JOBS = web.AppKey("jobs", JobManager)
UPLOADS = web.AppKey("uploads", UploadedDatasets)  # datasets users upload (cloud.api.uploads)
FLEET = web.AppKey("fleet", FleetView)
TASKS = web.AppKey("tasks", TaskRunner)  # set by build_app when config.tasks_enabled
ROLLOUT = web.AppKey("rollout", RolloutController)  # set by cloud.api.rollout's cleanup context
ROLES = web.AppKey("roles", dict[str, Role])  # the roles this replica may hold (cloud/roles.py)
