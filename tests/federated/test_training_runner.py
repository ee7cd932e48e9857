"""The training service's decision wiring, in process: real EpochLogs, a real link view value, no cloud.

private=false on a good link -> upload raw: the samples themselves go into the uplink log, once; the
link going down (a poke, as a new placement plan does) -> train locally; private=true -> train locally
whatever the link; disabled -> nothing runs. Each decision and its reason shows in ``status()``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from gateway.federated.forward import RawForwarder
from gateway.federated.runner import TrainingRunner, open_sample_log
from gateway.federated.samples import sample_record
from gateway.placement.cost import LinkView
from gateway.storage.epoch_log import EpochLog
from protocol.config import TrainingConfig
from protocol.control import TrainingSettings
from tests.harness.poll import eventually
from tests.harness.processes import free_port

N_SAMPLES = 40
GOOD = LinkView("up", 0.02, 2_000_000.0)
DOWN = LinkView("down", 0.02, 2_000_000.0)


async def read_all(log: EpochLog) -> list[bytes]:
    return [data async for _, data in log.read(log.trimmed_lsn + 1)]


async def write_samples(data_dir: Path, config: TrainingConfig) -> list[bytes]:
    log = open_sample_log(data_dir, config)
    await log.open()
    generator = torch.Generator().manual_seed(0)
    records = [
        sample_record("camera", float(i), torch.rand(1, 8, 8, generator=generator), i % 10)
        for i in range(N_SAMPLES)
    ]
    for record in records:
        await log.append(record)
    await log.flush(wait=True)
    await log.close()
    return records


def runner(
    data_dir: Path,
    config: TrainingConfig,
    uplink_log: EpochLog,
    link_view: Callable[[], LinkView],
    wake_uplink: Callable[[], None] | None = None,
) -> TrainingRunner:
    """gw1's training runner; its cloud is a free port nobody listens on."""
    return TrainingRunner(
        config,
        gateway_id="gw1",
        data_dir=data_dir,
        cloud_url=f"http://127.0.0.1:{free_port()}",
        token="t",
        uplink_log=uplink_log,
        link_view=link_view,
        wake_uplink=wake_uplink,
    )


async def test_choice_is_made_shown_and_acted_on(tmp_path: Path) -> None:
    config = TrainingConfig(decide_interval_s=30.0, poll_interval_s=0.2, forward_batch=16)
    samples = await write_samples(tmp_path, config)
    uplink_log = EpochLog(tmp_path / "log", segment_bytes=1 << 20, max_bytes=8 << 20, writer_threads=1)
    await uplink_log.open()
    link = [GOOD]
    wakes = []
    runtime = runner(tmp_path, config, uplink_log, lambda: link[0], wake_uplink=lambda: wakes.append(1))
    try:
        applied = await runtime.apply(TrainingSettings(enabled=True, private=False))
        assert applied.state == "running" and applied.detail.startswith("upload_raw")
        status = runtime.status()
        assert status["mode"] == "upload_raw" and "fits the link" in status["reason"]
        assert status["state"] == "forwarding_raw" and status["trigger"] == "config"
        await eventually(
            lambda: runtime.status()["forwarder"]["forwarded"] == N_SAMPLES, 20, "raw samples sent"
        )
        assert await read_all(uplink_log) == samples  # the samples themselves, byte for byte, once
        assert wakes and runtime.status()["client"]["rounds"] == 0

        link[0] = DOWN  # what a new placement plan reports; the daemon's plan callback pokes
        runtime.poke()
        await eventually(lambda: runtime.status()["state"] == "training", 20, "re-decided on the link")
        status = runtime.status()
        assert status["reason"].startswith("link down") and status["trigger"] == "link"
        assert status["state"] == "training" and status["torch_loaded"]
        assert [d["mode"] for d in status["decisions"]] == ["upload_raw", "train_locally"]
        await eventually(
            lambda: runtime.status()["client"]["fetch_failures"] >= 1, 20, "a round ran (no cloud)"
        )
        assert runtime.status()["last_error"]

        link[0] = GOOD
        applied = await runtime.apply(TrainingSettings(enabled=True, private=True))
        assert applied.detail.startswith("train_locally: private")
        assert runtime.status()["mode"] == "train_locally"

        applied = await runtime.apply(TrainingSettings(enabled=False, private=True))
        assert applied.state == "stopped" and runtime.status()["state"] == "stopped"
        assert runtime.status()["mode"] is None

        passes = runtime.status()["forwarder"]["passes"]
        await runtime.apply(TrainingSettings(enabled=True, private=False))  # raw again: nothing resent
        # a pass starts after the one before it has ended: two new passes mean one whole pass ran
        await eventually(
            lambda: runtime.status()["forwarder"]["passes"] >= passes + 2, 20, "a whole forwarder pass"
        )
        assert runtime.status()["state"] == "forwarding_raw"
        assert runtime.status()["forwarder"]["forwarded"] == N_SAMPLES
        assert len(await read_all(uplink_log)) == N_SAMPLES
        metrics = runtime.metrics()
        assert metrics["mode_raw"] == 1.0 and metrics["raw_forwarded"] == N_SAMPLES
    finally:
        await runtime.stop()
        await uplink_log.close()

    # the cursor survives a restart: a new forwarder on the same files copies nothing again
    data_log = open_sample_log(tmp_path, config)
    await data_log.open()
    uplink_log = EpochLog(tmp_path / "log", segment_bytes=1 << 20, max_bytes=8 << 20, writer_threads=1)
    await uplink_log.open()
    try:
        forwarder = RawForwarder(data_log, uplink_log, tmp_path / "training" / "forwarded.json")
        assert forwarder.cursor == N_SAMPLES and await forwarder.forward_once() == 0
    finally:
        await data_log.close()
        await uplink_log.close()


async def test_a_failed_start_says_why_and_a_good_restart_clears_it(tmp_path: Path) -> None:
    config = TrainingConfig(decide_interval_s=30.0, forward_batch=16)
    await write_samples(tmp_path, config)
    uplink_log = EpochLog(tmp_path / "log", segment_bytes=1 << 20, max_bytes=8 << 20, writer_threads=1)
    await uplink_log.open()
    runtime = runner(tmp_path, config, uplink_log, lambda: GOOD)
    cursor = tmp_path / "training" / "forwarded.json"
    cursor.mkdir()  # where the forwarder writes its cursor: the forwarder cannot work
    try:
        applied = await runtime.apply(TrainingSettings(enabled=True, private=False))
        assert applied.state == "running"  # it starts; its first pass fails
        await eventually(lambda: runtime.health(), 20, "the forwarder's failing pass seen")
        health = runtime.health()
        assert health is not None and health.state == "degraded" and "raw forwarder" in health.detail
        assert "IsADirectoryError" in health.detail and runtime.status()["last_error"]

        await runtime.apply(TrainingSettings(enabled=False, private=False))
        cursor.rmdir()  # fixed; the service starts again: the error is history
        applied = await runtime.apply(TrainingSettings(enabled=True, private=False))
        assert applied.state == "running" and runtime.status()["last_error"] is None
        await eventually(
            lambda: runtime.status()["forwarder"]["forwarded"] == N_SAMPLES, 20, "raw samples sent"
        )
        assert runtime.health() is None
    finally:
        await runtime.stop()
        await uplink_log.close()
