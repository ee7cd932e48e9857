"""The plan uses the edge costs measured on this box, on real processes: mosquitto, cloudd, two
gatewayds reading the same devicesim camera, uploading to cloudd over localhost (a fast link, and
believed fast from the start: ``prior_goodput_Bps``).

- gw1 measures (the default): /status reports camera/infer's edge cost as "measured", far below the
  catalog's Raspberry-Pi-class 0.45 s (the scene model is a 48x48 CNN), and the camera's measured
  frame rate and frame size; every plan it made kept infer at the edge, so no frame went to the cloud
  (``dispatch_inputs`` off: what is asserted is the plan; with it on, a frame the busy engine's queue
  would delay may spill to the cloud, docs/placement.md "Dispatching each frame").
- gw2 declares ``[placement.edge_costs] "camera/infer" = 0.45``, as a Pi-class box would: the
  declared cost is in force (what it measures is only shown) and, on the same link, its plan runs
  infer in the cloud: frames go up for cloudd to infer.
- A declared cost that names no task keeps gatewayd from starting, with the field and the task named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness.camera import DevicesimCamera
from tests.harness.gatewayd import Gatewayd, write_config
from tests.harness.processes import free_port, run_module

pytestmark = pytest.mark.slow  # five processes and a live camera

PI_CLASS_INFER_S = 0.45  # gateway/taskgraphs/catalog.py's camera_graph


def config_text(camera_url: str, blob_dir: Path, declared: str = "") -> str:
    return (
        f'blob_dir = "{blob_dir}"\n'  # still inside write_config's [uplink]
        "[log]\nflush_interval_ms = 50\n"
        "[placement]\nprobe_interval_s = 0.5\ngoodput_every = 1\nprior_goodput_Bps = 10000000.0\n"
        "dispatch_inputs = false\n"
        f"{declared}"
        f'[camera]\nenabled = true\ncamera_id = "cam1"\nsource = "{camera_url}"\n'
        "open_timeout_s = 3.0\nread_timeout_s = 3.0\nbackoff_initial_s = 0.2\nbackoff_max_s = 1.0\n"
    )


def infer_sides(status: dict[str, Any]) -> list[str]:
    """Where camera/infer was in every plan this gateway made (its decision log)."""
    decisions = status["placement"]["decisions"]
    return [p.split("@")[1] for d in decisions for p in d["placement"] if p.startswith("camera/infer@")]


def test_the_plan_uses_the_cost_measured_here_unless_one_is_declared(
    tmp_path: Path, mosquitto, cloudd
) -> None:
    camera = DevicesimCamera(free_port(), tmp_path / "truth.jsonl", seed=3, fps=4.0)
    gateways = {}
    try:
        for gw, declared in (
            ("gw1", ""),
            ("gw2", f'[placement.edge_costs]\n"camera/infer" = {PI_CLASS_INFER_S}\n'),
        ):
            config, port = write_config(
                tmp_path,
                mosquitto.url,
                gateway_id=gw,
                cloud_url=cloudd.url,
                token=cloudd.token_for(gw),
                extra=config_text(camera.url, tmp_path / f"blobs-{gw}", declared),
            )
            gateways[gw] = Gatewayd(config, port)
        measuring, declaring = gateways["gw1"].wait_ready(), gateways["gw2"].wait_ready()

        # gw1: the cost it measured is in force, and the frames are inferred here
        status = measuring.wait_status(
            lambda s: (
                s["camera"]["events"]["frames_inferred_here"] >= 4
                and "camera rate_hz" in s["placement"]["costs"]["latest"]
            ),
            60,
            "gw1 infers frames and has measured the camera's rate",
        )
        costs = status["placement"]["costs"]
        infer = costs["tasks"]["camera/infer"]
        assert infer["source"] == "measured" and 0 < infer["edge_cost_s"] < 0.1, infer
        engine = status["camera"]["engine"]
        assert engine["cost_from"] in ("probe", "batches") and engine["cost_s_per_input"] < 0.1, engine
        latest = costs["latest"]
        assert latest["camera rate_hz"] > 0 and latest["camera/change output_bytes"] > 0, latest
        assert status["placement"]["link"]["state"] == "up"
        assert status["placement"]["link"]["goodput_Bps"] >= 1_000_000  # a fast link, believed
        assert set(infer_sides(status)) == {"edge"}, status["placement"]["decisions"]
        assert status["camera"]["sides"]["infer"] == "edge"  # (summarise goes where the plan says)
        assert status["camera"]["events"]["frames_for_cloud"] == 0

        # gw2: the declared Pi-class cost is in force, and on the same link frames go to the cloud
        status = declaring.wait_status(
            lambda s: s["camera"]["events"]["frames_for_cloud"] >= 4,
            60,
            "gw2 sends frames for cloud inference",
        )
        costs = status["placement"]["costs"]
        assert costs["tasks"]["camera/infer"] == {
            **costs["tasks"]["camera/infer"],
            "edge_cost_s": PI_CLASS_INFER_S,
            "source": "declared",
        }
        assert costs["latest"]["camera/infer edge_cost_s"] < 0.1  # measured all the same, and shown
        assert infer_sides(status)[-1] == "cloud"
        assert status["camera"]["sides"] == {"infer": "cloud", "summarise": "cloud"}
    finally:
        camera.stop()
        for gateway in gateways.values():
            gateway.terminate()


def test_a_declared_cost_that_names_no_task_stops_gatewayd_naming_it(tmp_path: Path) -> None:
    config, _ = write_config(
        tmp_path, "mqtt://127.0.0.1:9", extra='[placement.edge_costs]\n"camera/inference" = 0.45\n'
    )
    result = run_module("gateway.daemon", ["--config", str(config)], timeout_s=20)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "placement.edge_costs" in lines[0] and "has no task 'inference'" in lines[0], lines[0]
