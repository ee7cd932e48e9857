"""The per-service task graphs (sensor, camera, training) as validated data, and edge-cost profiling."""

from gateway.taskgraphs.catalog import (
    camera_graph,
    default_graphs,
    sensor_graph,
    training_graph,
    vibration_graph,
)
from gateway.taskgraphs.graph import Side, Task, TaskGraph, TaskGraphError, format_graphs, parse_graphs

__all__ = [
    "TaskGraph",
    "TaskGraphError",
    "Side",
    "Task",
    "camera_graph",
    "default_graphs",
    "format_graphs",
    "parse_graphs",
    "sensor_graph",
    "training_graph",
    "vibration_graph",
]
