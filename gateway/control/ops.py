"""Pure functions of the control plane: layering, merge patch, digests, and each operation's effect.

The effective config is the config file's values (the *base*) overlaid, field by field, with what
operators set over MQTT (the *overrides*). An operation maps the effective config to a new one;
every field it changed joins the overrides, so
``effective(base, overrides_after(o, effective(base, o), c)) == c`` for every valid ``c``.

Invariant: every function returns a valid ``DesiredConfig`` or raises ``ControlError`` naming the
field; none has side effects, so a refused request cannot have changed anything.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from protocol.control import (
    SERVICE_NAMES,
    SETTINGS_MODELS,
    CameraSourceRequest,
    ConfigPatchRequest,
    ConfigSetRequest,
    ControlError,
    DesiredConfig,
    DeviceAddRequest,
    DeviceRemoveRequest,
    LogLevelRequest,
    ModelPinRequest,
    PlacementPinRequest,
    ServiceStartRequest,
    ServiceStopRequest,
    control_error_from,
)

# service -> task -> the side its graph pins it to (None: free); see gateway/taskgraphs/catalog.py
TaskCatalog = Mapping[str, Mapping[str, str | None]]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def effective(base: DesiredConfig, overrides: Mapping[str, Mapping[str, Any]]) -> DesiredConfig:
    """The base with each overridden field replaced; ControlError if the result is not valid."""
    data = base.model_dump(mode="json")
    for service, fields in overrides.items():
        if service not in data:
            raise ControlError("invalid", f"unknown service {service!r}", field=f"overrides.{service}")
        data[service].update(fields)
    try:
        return DesiredConfig.model_validate(data)
    except ValidationError as exc:
        raise control_error_from(exc) from None


def overrides_after(
    overrides: Mapping[str, Mapping[str, Any]],
    old: DesiredConfig,
    new: DesiredConfig,
    whole: str | None = None,
) -> dict[str, dict[str, Any]]:
    """The overrides once ``old`` became ``new``: a field set over MQTT stays set (it no longer follows
    the file); ``whole`` (config.set) marks every field of that service as set."""
    old_data, new_data = old.model_dump(mode="json"), new.model_dump(mode="json")
    out = {service: dict(fields) for service, fields in overrides.items()}
    for service in SERVICE_NAMES:
        fields = (
            new_data[service]
            if service == whole
            else {k: v for k, v in new_data[service].items() if old_data[service].get(k) != v}
        )
        if fields:
            out.setdefault(service, {}).update(fields)
    return out


def digest(config: DesiredConfig) -> str:
    return hashlib.sha256(json.dumps(config.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def changed_services(old: DesiredConfig, new: DesiredConfig) -> list[str]:
    return [s for s in SERVICE_NAMES if getattr(old, s) != getattr(new, s)]


def _section(service: str, data: Any, field: str) -> BaseModel:
    try:
        return SETTINGS_MODELS[service].model_validate(data)
    except ValidationError as exc:
        raise control_error_from(exc, prefix=field) from None


def _replace(config: DesiredConfig, service: str, section: BaseModel) -> DesiredConfig:
    data = config.model_dump(mode="json")
    data[service] = section.model_dump(mode="json")
    return DesiredConfig.model_validate(data)


def _update(config: DesiredConfig, service: str, field: str, **changes: Any) -> DesiredConfig:
    current = getattr(config, service).model_dump(mode="json")
    return _replace(config, service, _section(service, {**current, **changes}, field))


def _config_set(config: DesiredConfig, op: ConfigSetRequest, catalog: TaskCatalog) -> DesiredConfig:
    return _replace(config, op.service, _section(op.service, op.config, "config"))


def _config_patch(config: DesiredConfig, op: ConfigPatchRequest, catalog: TaskCatalog) -> DesiredConfig:
    current = getattr(config, op.service).model_dump(mode="json")
    patched = merge_patch(current, op.patch)
    return _replace(config, op.service, _section(op.service, patched, "patch"))


def _service_start(config: DesiredConfig, op: ServiceStartRequest, catalog: TaskCatalog) -> DesiredConfig:
    return _update(config, op.service, "service", enabled=True)


def _service_stop(config: DesiredConfig, op: ServiceStopRequest, catalog: TaskCatalog) -> DesiredConfig:
    return _update(config, op.service, "service", enabled=False)


def _device_add(config: DesiredConfig, op: DeviceAddRequest, catalog: TaskCatalog) -> DesiredConfig:
    allow = list(config.sensor.allow)
    if op.device in allow:
        return config  # already allowed: the config is unchanged
    return _update(config, "sensor", "device", allow=[*allow, op.device])


def _device_remove(config: DesiredConfig, op: DeviceRemoveRequest, catalog: TaskCatalog) -> DesiredConfig:
    allow = list(config.sensor.allow)
    if op.device not in allow:
        raise ControlError("not_found", f"{op.device!r} is not in sensor.allow {allow}", field="device")
    return _update(config, "sensor", "device", allow=[d for d in allow if d != op.device])


def _camera_source(config: DesiredConfig, op: CameraSourceRequest, catalog: TaskCatalog) -> DesiredConfig:
    changes: dict[str, Any] = {"source": op.source}
    if op.sample_fps is not None:
        changes["sample_fps"] = op.sample_fps
    try:
        return _update(config, "camera", "", **changes)
    except ControlError as exc:  # name the request's field, not the config's
        raise ControlError(exc.reason, exc.why, field=exc.field) from None


def _model_pin(config: DesiredConfig, op: ModelPinRequest, catalog: TaskCatalog) -> DesiredConfig:
    pins = _pinned(config.models.pins, op.model, op.version)
    return _update(config, "models", "model", pins=pins)


def _placement_pin(config: DesiredConfig, op: PlacementPinRequest, catalog: TaskCatalog) -> DesiredConfig:
    check_placement(catalog, op.service, op.task, op.where)
    pins = _pinned(config.placement.pins, f"{op.service}/{op.task}", op.where)
    return _update(config, "placement", "placement", pins=pins)


def _log_level(config: DesiredConfig, op: LogLevelRequest, catalog: TaskCatalog) -> DesiredConfig:
    return _update(config, "gateway", "level", log_level=op.level)


def _pinned(pins: Mapping[str, str], key: str, value: str | None) -> dict[str, str]:
    """``pins`` with ``key`` set to ``value``; None unpins."""
    out = dict(pins)
    if value is None:
        out.pop(key, None)
    else:
        out[key] = value
    return out


# request type -> its effect on the config (only placement pins consult the task catalog)
_CHANGES: dict[type[BaseModel], Callable[[DesiredConfig, Any, TaskCatalog], DesiredConfig]] = {
    ConfigSetRequest: _config_set,
    ConfigPatchRequest: _config_patch,
    ServiceStartRequest: _service_start,
    ServiceStopRequest: _service_stop,
    DeviceAddRequest: _device_add,
    DeviceRemoveRequest: _device_remove,
    CameraSourceRequest: _camera_source,
    ModelPinRequest: _model_pin,
    PlacementPinRequest: _placement_pin,
    LogLevelRequest: _log_level,
}


def apply_change(config: DesiredConfig, request: BaseModel, catalog: TaskCatalog) -> DesiredConfig:
    """The config after ``request`` (a change operation); ControlError naming the field if refused."""
    change = _CHANGES.get(type(request))
    if change is None:
        raise ControlError("unknown_op", f"{type(request).__name__} is not a change operation", field="op")
    return change(config, request, catalog)


def check_placement(catalog: TaskCatalog, service: str, task: str, where: str | None) -> None:
    if service not in catalog:
        raise ControlError(
            "not_found",
            f"no service {service!r} with a task graph; known: {', '.join(sorted(catalog))}",
            field="service",
        )
    tasks = catalog[service]
    if task not in tasks:
        raise ControlError(
            "not_found",
            f"service {service!r} has no task {task!r}; its tasks: {', '.join(tasks)}",
            field="task",
        )
    fixed = tasks[task]
    if where is not None and fixed is not None and fixed != where:
        raise ControlError(
            "conflict", f"{service}/{task} is pinned to {fixed} by its task graph", field="where"
        )


def check_placement_pins(catalog: TaskCatalog, config: DesiredConfig) -> None:
    """Every stored pin names a real task and agrees with its graph (for config.set/patch of placement)."""
    for key, where in config.placement.pins.items():
        service, task = key.split("/", 1)
        try:
            check_placement(catalog, service, task, where)
        except ControlError as exc:
            raise ControlError(exc.reason, exc.why, field=f"placement.pins.{key}") from None


def check_model_pins(models: Collection[str], old: DesiredConfig, new: DesiredConfig) -> None:
    """Every pin ``new`` adds or changes names a model this gateway runs (``models``): a pin of another
    could never apply. Pins already stored are left alone, and removing one is always allowed."""
    for name, version in new.models.pins.items():
        if old.models.pins.get(name) != version and name not in models:
            runs = f"its models: {', '.join(sorted(models))}" if models else "it runs no model"
            raise ControlError(
                "not_found", f"no model {name!r} on this gateway ({runs})", field=f"models.pins.{name}"
            )
