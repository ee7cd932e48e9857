"""The per-service task graphs (sensor, camera, training) as validated data, and edge-cost profiling."""

from gateway.services.catalog import (
    camera_service,
    default_services,
    sensor_service,
    training_service,
    vibration_service,
)
from gateway.services.graph import Service, ServiceError, Side, Task, format_services, parse_services

__all__ = [
    "Service",
    "ServiceError",
    "Side",
    "Task",
    "camera_service",
    "default_services",
    "format_services",
    "parse_services",
    "sensor_service",
    "training_service",
    "vibration_service",
]
