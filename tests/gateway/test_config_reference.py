"""deploy/gateway.example.toml is the configuration reference: it names every field of
protocol.config.GatewayConfig in its section, each active value is the field's default, and every
commented example is a valid value. Relative paths resolve as the file says."""

from __future__ import annotations

import re
import tomllib
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from protocol.config import GatewayConfig, load_gateway_config, parse_gateway_config
from protocol.errors import ProtocolError

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "gateway.example.toml"
REQUIRED = {"gateway_id", "data_dir"}  # no default: the example's values are examples
_HEADER = re.compile(r"^#?\s*\[([a-z_.]+)\]")
_KEY = re.compile(r'^(#?)\s*("?[A-Za-z_/]+"?\s*=.*)$')


def section_model(annotation: object) -> type[BaseModel] | None:
    """The section model an annotation holds (``CameraConfig | None`` -> CameraConfig), if any; a
    mapping of models (``dict[str, Bounds]``) is a field, not a section."""
    if typing.get_origin(annotation) is dict:
        return None
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def field_paths(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """``section.field`` for every field (a dict field, like ``placement.pins``, is one field)."""
    for name, info in model.model_fields.items():
        section = section_model(info.annotation)
        yield from field_paths(section, f"{prefix}{name}.") if section else (f"{prefix}{name}",)


def example_lines() -> Iterator[tuple[str, bool, str]]:
    """(section, commented, "key = value") for each line of the example that sets a key."""
    section = ""
    for line in EXAMPLE.read_text().splitlines():
        header = _HEADER.match(line.strip())
        if header:
            section = header.group(1)
            continue
        setting = _KEY.match(line.strip())
        if setting:
            yield section, setting.group(1) == "#", setting.group(2).split(" # ")[0].strip()


def named_in_example() -> set[str]:
    named = {section for section, _, _ in example_lines()}
    for section, _, setting in example_lines():
        key = setting.split("=")[0].strip().strip('"')
        named.add(f"{section}.{key}" if section else key)
    return named


def test_the_example_names_every_field_in_its_section():
    missing = [path for path in field_paths(GatewayConfig) if path not in named_in_example()]
    assert not missing, f"deploy/gateway.example.toml does not mention {missing}"


def test_each_active_value_in_the_example_is_the_default():
    data = tomllib.loads(EXAMPLE.read_text())
    defaults = GatewayConfig(gateway_id="gw1", data_dir=Path("/x")).model_dump(mode="json")
    differs = []
    for section, values in data.items():
        for key, value in values.items() if isinstance(values, dict) else [(None, values)]:
            path = section if key is None else f"{section}.{key}"
            default = defaults[section] if key is None else defaults[section][key]
            if section not in REQUIRED and value != default:
                differs.append(f"{path} = {value!r} (default {default!r})")
    assert not differs


def test_every_commented_example_is_a_valid_value(tmp_path):
    """Uncomment every commented setting (and its section header): the file still loads."""
    text = EXAMPLE.read_text()
    uncommented = re.sub(r'(?m)^#\s*(\[[a-z_.]+\]\s*(#.*)?|"?[A-Za-z_/]+"?\s*=.*)$', r"\1", text)
    (tmp_path / "gateway.toml").write_text(uncommented)
    config = load_gateway_config(tmp_path / "gateway.toml")
    assert config.camera is not None and config.uplink.token_file is not None
    assert config.placement.edge_costs == {"camera/infer": 0.45}


def test_relative_paths_resolve_next_to_the_file_and_inside_data_dir(tmp_path):
    data = {
        "gateway_id": "gw1",
        "data_dir": "state",
        "mqtt": {"password_file": "mqtt-password"},
        "uplink": {"token_file": "cloud-token", "blob_dir": "blobs"},
        "camera": {"artifact_dir": "models/scene"},
    }
    config = parse_gateway_config(data, base_dir=tmp_path / "etc")
    assert config.data_dir == tmp_path / "etc" / "state"
    assert config.mqtt.password_file == tmp_path / "etc" / "mqtt-password"
    assert config.uplink.token_file == tmp_path / "etc" / "cloud-token"
    assert config.uplink.blob_dir == tmp_path / "etc" / "state" / "blobs"
    assert config.camera is not None and config.camera.artifact_dir == tmp_path / "etc" / "models" / "scene"
    absolute = parse_gateway_config({**data, "uplink": {"blob_dir": "/var/blobs"}}, base_dir=tmp_path)
    assert absolute.uplink.blob_dir == Path("/var/blobs")


def test_the_cross_field_rules_the_example_states_are_enforced():
    with pytest.raises(ProtocolError, match="twice segment_bytes"):
        parse_gateway_config(
            {"gateway_id": "gw1", "data_dir": "/x", "log": {"segment_bytes": 1 << 20, "max_bytes": 1 << 20}}
        )
    with pytest.raises(ProtocolError, match="source is required"):
        parse_gateway_config({"gateway_id": "gw1", "data_dir": "/x", "camera": {"enabled": True}})


def test_an_empty_goodput_path_turns_the_payload_probes_off():
    config = parse_gateway_config({"gateway_id": "gw1", "data_dir": "/x", "placement": {"goodput_path": ""}})
    assert config.placement.goodput_path is None
