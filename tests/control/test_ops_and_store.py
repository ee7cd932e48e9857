"""The pure parts of the control plane (layering, merge patch, operations) and its file on disk."""

from __future__ import annotations

import json

import pytest

from gateway.control.ops import (
    apply_change,
    changed_services,
    check_model_pins,
    effective,
    merge_patch,
    overrides_after,
)
from gateway.control.store import ControlStore
from gateway.control.wiring import task_catalog
from protocol.control import (
    ControlError,
    DesiredConfig,
    SensorSettings,
    StoredControl,
    parse_request,
)


def test_merge_patch_follows_rfc7386():
    assert merge_patch({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None, "e": 4}, "f": [1]}) == {
        "a": 1,
        "b": {"d": 3, "e": 4},
        "f": [1],
    }
    assert merge_patch({"a": 1}, [1, 2]) == [1, 2]


def test_overrides_reproduce_the_config_and_follow_the_file_elsewhere():
    base = DesiredConfig(sensor=SensorSettings(allow=["a-*"]))
    catalog = task_catalog()
    config = base
    overrides: dict = {}
    for op, body in (
        ("log.level", b'{"level": "DEBUG"}'),
        ("device.add", b'{"device": "b-1"}'),
        ("placement.pin", b'{"service": "camera", "task": "infer", "where": "cloud"}'),
    ):
        new = apply_change(config, parse_request(op, body), catalog)
        overrides = overrides_after(overrides, config, new)
        config = new
        assert effective(base, overrides) == config
    assert config.sensor.allow == ["a-*", "b-1"]
    # the file changes a field nobody set over MQTT: it follows; the overridden ones stay
    new_base = DesiredConfig(sensor=SensorSettings(allow=["z"], enabled=False))
    reloaded = effective(new_base, overrides)
    assert reloaded.sensor.enabled is False and reloaded.sensor.allow == ["a-*", "b-1"]
    assert changed_services(config, reloaded) == ["sensor"]


@pytest.mark.parametrize(
    ("op", "body", "field"),
    [
        ("config.set", b'{"service": "camera", "config": {"sample_fps": -1}}', "config.sample_fps"),
        ("config.patch", b'{"service": "sensor", "patch": {"allow": ["ok", "bad/one"]}}', "patch.allow.1"),
        ("config.patch", b'{"service": "sensor", "patch": {"colour": "red"}}', "patch.colour"),
        ("camera.source", b'{"source": "ftp://cam/1"}', "source"),
        ("device.remove", b'{"device": "nobody"}', "device"),
        ("placement.pin", b'{"service": "camera", "task": "nope", "where": "edge"}', "task"),
        ("placement.pin", b'{"service": "sensor", "task": "upload", "where": "edge"}', "where"),
        ("model.pin", b'{"model": "scene", "version": "a b"}', "version"),
        ("nope", b"{}", "op"),
        ("config.get", b"{", "<payload>"),
        ("config.get", b"[]", "<payload>"),
        # strict types: another JSON type is refused, never converted
        ("config.patch", b'{"service": "sensor", "patch": {"enabled": "yes"}}', "patch.enabled"),
        ("config.patch", b'{"service": "sensor", "patch": {"enabled": 1}}', "patch.enabled"),
        ("config.set", b'{"service": "training", "config": {"private": 0}}', "config.private"),
        ("service.start", b'{"service": "sensor", "revision": "0"}', "revision"),
        ("service.start", b'{"service": "sensor", "revision": 0.0}', "revision"),
        ("log.errors", b'{"limit": 5.0}', "limit"),
        ("log.errors", b'{"level": "DEBUG"}', "level"),
        ("log.errors", b'{"after": 17}', "after"),
        ("service.restart", b'{"service": "gateway"}', "service"),
        ("service.restart", b'{"service": "sensor", "revision": 0}', "revision"),
        ("services.list", b'{"v": true}', "v"),
        ("services.list", b'{"v": 1.0}', "v"),
        ("camera.source", b'{"source": 7}', "source"),
    ],
)
def test_refusals_name_the_field(op, body, field):
    with pytest.raises(ControlError) as info:
        apply_change(DesiredConfig(), parse_request(op, body), task_catalog())
    assert info.value.field == field, info.value.detail


def test_a_pin_must_name_a_model_this_gateway_runs():
    def pinned(config: DesiredConfig, model: str, version: str | None) -> DesiredConfig:
        body = json.dumps({"model": model, "version": version}).encode()
        return apply_change(config, parse_request("model.pin", body), task_catalog())

    scene = pinned(DesiredConfig(), "scene", "3")
    check_model_pins({"scene"}, DesiredConfig(), scene)  # the camera's model: fine
    with pytest.raises(ControlError) as info:
        check_model_pins({"scene"}, scene, pinned(scene, "digits", "1"))
    assert info.value.field == "models.pins.digits" and "its models: scene" in info.value.detail
    with pytest.raises(ControlError) as info:
        check_model_pins(set(), DesiredConfig(), scene)  # no camera: no model to pin
    assert "runs no model" in info.value.detail
    # a pin stored before (say, the camera was configured then) neither blocks others nor its removal
    debug = apply_change(scene, parse_request("log.level", b'{"level": "DEBUG"}'), task_catalog())
    check_model_pins(set(), scene, debug)
    check_model_pins(set(), scene, pinned(scene, "scene", None))


def test_store_is_atomic_and_survives_debris_and_corruption(tmp_path):
    store = ControlStore(tmp_path / "control")
    assert store.load() is None
    stored = StoredControl(revision=3, overrides={"gateway": {"log_level": "DEBUG"}})
    store.save(stored)
    (store.directory / ".desired.json.k3x9q.tmp").write_text("half a wri")  # crashed before its rename
    assert store.load() == stored
    assert not (store.directory / ".desired.json.k3x9q.tmp").exists()
    store.path.write_text(json.dumps({"v": 1, "revision": -1}))  # not crash damage: corruption
    assert store.load() is None
    assert [p.name.split("-")[0] for p in store.directory.iterdir()] == ["desired.json.corrupt"]
