"""Writing job-file TOML: a section of plain values (nested tables as ``[name.sub]``) and the
``[partition]`` a spec's stages and replicas mean.

Invariant: ``tomllib.loads("\\n".join(section_lines(name, values)))[name] == values`` for values
made of bools, ints, floats, strings, lists of those and nested dicts (what the option sections
hold); a pure module.
"""

from __future__ import annotations

import json
import math
from typing import Any

from cloud.training.partition import even_plan


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{value} has no TOML form")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def section_lines(name: str, values: dict[str, Any]) -> list[str]:
    """``[name]``, its plain keys, a blank line, then each nested dict as ``[name.key]``."""
    plain = {k: v for k, v in values.items() if not isinstance(v, dict)}
    lines = [f"[{name}]", *(f"{key} = {_value(v)}" for key, v in plain.items()), ""]
    for key, nested in values.items():
        if isinstance(nested, dict):
            lines += section_lines(f"{name}.{key}", nested)
    return lines


def partition_lines(replicas: list[int] | None, layers: int | None, *, straight: bool) -> list[str]:
    """``[partition]``: the partitioner (``mode = "auto"``) when ``replicas`` is None, else explicit
    layer ranges spread evenly over ``len(replicas)`` stages of a ``layers``-long model."""
    if replicas is None:
        return section_lines("partition", {"mode": "auto", "straight": straight})
    if layers is None:
        raise ValueError("stages: fixed stages need the model's layer count (the job's prepare step)")
    try:
        plan = even_plan(layers, len(replicas))
    except ValueError as exc:
        raise ValueError(f"stages: {exc}") from None
    ranges = [[s.first, s.last] for s in plan.stages]
    return section_lines("partition", {"mode": "explicit", "stages": ranges, "replicas": replicas})
