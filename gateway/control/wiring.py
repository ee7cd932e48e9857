"""What the runner needs to build the control plane from a GatewayConfig: the base desired config
(the file's values), the task catalog placement pins are checked against, and the models a pin may
name.

Invariant: ``base_from_file`` returns a valid DesiredConfig or raises ControlError naming the file's
field (``devices.allow``, ``placement.pins``, ``camera.source``, or ``placement.edge_costs`` when a
declared cost names no task of the catalog), so a SIGHUP with such a file is refused whole, and
gatewayd refuses to start with it.
"""

from __future__ import annotations

from pydantic import ValidationError

from gateway.control.ops import TaskCatalog
from gateway.taskgraphs.catalog import default_graphs
from gateway.taskgraphs.measured import check_edge_costs
from protocol.config import GatewayConfig
from protocol.control import ControlError, DesiredConfig, control_error_from


def base_from_file(config: GatewayConfig) -> DesiredConfig:
    """The config file's say: ``[devices] allow``, ``log_level``, ``[placement] pins``, ``[camera]``
    enabled/source/sample_fps, ``[training]`` enabled/private; the rest default. The file's
    ``[placement.edge_costs]`` are not the control plane's, but are checked here all the same."""
    errors = check_edge_costs(default_graphs(), config.placement.edge_costs)
    if errors:
        raise ControlError("invalid", "; ".join(errors), field="placement.edge_costs")
    data: dict = {
        "sensor": {"allow": list(config.devices.allow)},
        "gateway": {"log_level": config.log_level},
        "placement": {"pins": dict(config.placement.pins)},
        "training": {"enabled": config.training.enabled, "private": config.training.private},
    }
    if config.camera is not None:
        camera = config.camera
        data["camera"] = {"enabled": camera.enabled, "source": camera.source, "sample_fps": camera.sample_fps}
    try:
        return DesiredConfig.model_validate(data)
    except ValidationError as exc:
        error = control_error_from(exc)
        renamed = {"sensor.allow": "devices.allow", "gateway.log_level": "log_level"}
        field = error.field or ""
        for ours, theirs in renamed.items():
            field = field.replace(ours, theirs, 1)
        raise ControlError("invalid", error.why, field=field) from None


def task_catalog() -> TaskCatalog:
    """service -> task -> the side its graph requires (declared pins, sources, privacy; None: free)."""
    return {
        service.name: {task.name: service.required_pins().get(task.name) for task in service.tasks}
        for service in default_graphs()
    }


def known_models(config: GatewayConfig) -> frozenset[str]:
    """The models this gatewayd runs, so the only ones the ``models`` service may pin: the camera's."""
    return frozenset({config.camera.model} if config.camera is not None else ())
