"""The extras gate (gateway/extras.py) and the import contract behind it: which config section needs
which extra, the line that says so, the control plane's answer, and that the gateway core's modules
load none of the heavy packages (the forbidden contract in pyproject.toml, checked here at run time).
A fresh install without extras is tests/gateway/test_core_install.py."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from gateway.control.handlers import Applied
from gateway.extras import EXTRA_MODULES, SECTION_EXTRA, NeedsExtraHandler, missing_extras
from protocol.config import GatewayConfig
from protocol.control import CameraSettings, TrainingSettings
from tests.harness.processes import REPO, repo_env

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def core_contract() -> dict:
    """The import-linter contract that keeps the gateway core free of heavy packages."""
    (contract,) = [c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["type"] == "forbidden"]
    return contract


def without(*absent: str):
    """An ``installed`` predicate for an install that lacks the modules ``absent``."""
    return lambda name: name not in absent


def config(tmp_path: Path, **sections) -> GatewayConfig:
    return GatewayConfig.model_validate({"gateway_id": "gw1", "data_dir": str(tmp_path), **sections})


CAMERA_ON = {"camera": {"enabled": True, "source": "rtsp://cam/1"}}


def test_a_section_the_config_enables_without_its_extra_is_named_with_the_fix(tmp_path):
    assert missing_extras(config(tmp_path, **CAMERA_ON), without("cv2", "onnxruntime")) == [
        "[camera] needs the \"camera\" extra: pip install 'edgefed[camera]' (not installed: cv2, onnxruntime)"
    ]
    assert missing_extras(config(tmp_path, training={"enabled": True}), without("torch")) == [
        "[training] needs the \"train\" extra: pip install 'edgefed[train]' (not installed: torch)"
    ]
    both = config(tmp_path, training={"enabled": True}, **CAMERA_ON)
    sections = [line.split(" ")[0] for line in missing_extras(both, without("numpy"))]
    assert sections == ["[camera]", "[training]"]


def test_a_section_that_is_off_or_whose_extra_is_installed_needs_nothing(tmp_path):
    off = config(tmp_path, camera={"enabled": False}, training={"enabled": False})
    assert missing_extras(off, without("numpy", "cv2", "onnxruntime", "torch")) == []
    assert missing_extras(config(tmp_path), without("torch", "cv2")) == []  # sensor-only
    on = config(tmp_path, training={"enabled": True}, **CAMERA_ON)
    assert missing_extras(on, without("sklearn", "numba")) == []  # the cloud's packages are not the gateway's


def test_every_extra_the_gateway_names_is_in_pyproject_and_in_all():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(SECTION_EXTRA.values()) == set(EXTRA_MODULES) <= set(extras)
    assert extras["all"] == ["edgefed[camera,train,cloud,demo]"]
    core = " ".join(PYPROJECT["project"]["dependencies"])
    for heavy in ("torch", "numpy", "opencv", "onnx", "scikit-learn", "numba"):
        assert heavy not in core


class Recorder:
    """The service's own handler: what reached it."""

    def __init__(self) -> None:
        self.applied: list[object] = []

    async def apply(self, settings):
        self.applied.append(settings)
        return Applied("stopped", True, "training disabled")


async def test_enabling_a_service_without_its_extra_fails_with_the_line_and_reaches_nothing():
    own = Recorder()
    handler = NeedsExtraHandler("training", when_off=own, installed=without("torch"))
    line = "[training] needs the \"train\" extra: pip install 'edgefed[train]' (not installed: torch)"
    assert await handler.apply(TrainingSettings(enabled=True)) == Applied("failed", False, line)
    assert own.applied == []
    off = TrainingSettings(enabled=False)
    assert await handler.apply(off) == Applied("stopped", True, "training disabled")
    assert own.applied == [off]


async def test_a_camera_without_its_extra_is_off_and_says_what_enabling_it_needs():
    handler = NeedsExtraHandler("camera", installed=without("cv2"))
    off = await handler.apply(CameraSettings(enabled=False))
    assert off.state == "stopped" and off.applied and "pip install 'edgefed[camera]'" in off.detail
    on = await handler.apply(CameraSettings(enabled=True, source="rtsp://cam/1"))
    assert on.state == "failed" and not on.applied and "(not installed: cv2)" in on.detail


def test_the_gateway_core_modules_load_no_heavy_package():
    # import-linter also counts imports inside functions (the lazy doors, listed as ignore_imports);
    # this imports every core module, here where every package is installed, and looks at what loaded.
    contract = core_contract()
    script = f"""
import importlib, pkgutil, sys
for name in {contract["source_modules"]!r}:
    module = importlib.import_module(name)
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), name + "."):
        importlib.import_module(info.name)
print(" ".join(sorted(set({contract["forbidden_modules"]!r}) & set(sys.modules))))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=repo_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
    assert {"torch", "cv2", "sklearn", "numba", "onnxruntime", "onnx"} <= set(contract["forbidden_modules"])
