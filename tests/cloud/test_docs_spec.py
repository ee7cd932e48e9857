"""docs/training.md, "The job spec", stays true: its full example is accepted by a real cloudd
(through ``cloudctl train --file``), and its tables name every field the spec and its sections have."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from cloud.jobs.spec import JobSpec
from tests.harness.cloud_http import call
from tests.harness.cloudd import OPERATOR_TOKEN as OP
from tests.harness.cloudd import start_cloudd

DOC = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def spec_section() -> str:
    text = DOC.read_text()
    start = text.index("\n## The job spec\n")
    return text[start : text.index("\n## ", start + 1)]


def example_toml() -> str:
    return re.search(r"```toml\n(.*?)```", spec_section(), re.S).group(1)  # type: ignore[union-attr]


def field_names(model: type[BaseModel], prefix: str = "") -> list[str]:
    names = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            names += field_names(kind, f"{prefix}{name}.")
        else:
            names.append(prefix + name)
    return names


def test_every_field_is_documented_and_in_the_example():
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", spec_section(), re.M))
    fields = field_names(JobSpec)
    assert set(fields) == documented, set(fields) ^ documented

    def flat(table: dict, prefix: str = "") -> set[str]:
        out: set[str] = set()
        for key, value in table.items():
            out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key}
        return out

    assert flat(tomllib.loads(example_toml())) == set(fields)  # "a full example": every field


def test_the_docs_example_is_accepted_by_cloudd(tmp_path):
    cloudd = start_cloudd(tmp_path / "c", extra_args=("--max-running-jobs", "0"))
    try:
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(60, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, size=60)
        np.savez(tmp_path / "shapes.npz", x=x, y=y)
        assert cloudd.ctl("datasets", "upload", "shapes", str(tmp_path / "shapes.npz")).returncode == 0
        # the factory's folder is the one thing of the example that names this machine
        text = re.sub(r'(?m)^pythonpath = ".*"', f"pythonpath = {json.dumps(str(tmp_path))}", example_toml())
        (tmp_path / "spec.toml").write_text(text)
        result = cloudd.ctl("train", "--file", str(tmp_path / "spec.toml"), "--json")
        assert result.returncode == 0, result.stderr
        job = json.loads(result.stdout)
        status, again = call(f"{cloudd.url}/v1/jobs/{job['id']}", OP)
        assert status == 200 and again["spec"]["model"] == "shapes_models:small_cnn"
        assert again["spec"]["sync"]["enabled"] and again["spec"]["replicas"] == [2]
    finally:
        cloudd.stop()
