"""``sync.collective``: a job whose replicated stage sums its gradients with packed trees (through
the sync scheduler's lanes, and through the executor's plain all-reduce) trains to the parameters
of torch.distributed's all-reduce. Real torchrun, 3 ranks, one stage of 3 replicas, on a fabric
file whose ranks 0 and 2 are joined by a slow link only (the packing routes around it), and on the
fabric a probe measures at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud.training.collectives.topology import Link, Topology, dump
from tests.harness.pipeline_reference import max_relative_difference, merged_checkpoint
from tests.harness.torchrun import run_job, write_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS, BATCH, MICRO, WORLD = 6, 48, 3, 3


def run(tmp: Path, sync: str) -> tuple[dict, dict]:
    """Train the job in ``tmp`` with ``[sync]`` = ``sync``; its parameters and its start event
    (with the last step event's ``sync`` figures as ``"live_sync"``)."""
    tmp.mkdir()
    speeds = {(0, 1): 100e6, (1, 2): 100e6, (0, 2): 10e6}
    links = tuple(Link(s, d, bw, 1e-4) for (a, b), bw in speeds.items() for s, d in ((a, b), (b, a)))
    dump(Topology(("r0", "r1", "r2"), links), tmp / "fabric.json")
    job = write_job(
        tmp,
        schedule="1f1b-flush",
        microbatches=MICRO,
        batch_size=BATCH,
        steps=STEPS,
        stages=[(0, 8)],
        replicas=[WORLD],
        sections=f"[sync]\n{sync}\n",
        log_every=2,
    )
    events = run_job(job, WORLD, timeout_s=300)
    assert events[-1]["event"] == "done"
    start = next(e for e in events if e["event"] == "start")
    start["live_sync"] = [e for e in events if e["event"] == "step"][-1].get("sync")
    return merged_checkpoint(tmp / "ckpt", 1, STEPS), start


def test_packed_trees_train_to_the_plain_all_reduce_parameters(tmp_path: Path) -> None:
    plain, start = run(tmp_path / "torch", "")
    assert start["features"]["collective"] == "torch"
    trees = 'collective = "trees"\ntopology = "fabric.json"'  # relative to the job file
    synced, start = run(tmp_path / "trees_sync", f"enabled = true\nwindow = 2\n{trees}")
    assert start["features"]["sync"] == "on" and start["features"]["collective"] == "trees"
    assert start["live_sync"]["reducer_runs"] > 0  # the scheduler's messages went through the trees
    assert max_relative_difference(synced, plain) <= 1e-5
    probed = 'collective = "trees"\ntopology = "probe"'  # the fabric measured at start
    flat, start = run(tmp_path / "trees_plain", probed)  # the executor's one flat message
    assert start["features"]["sync"] == "off" and start["features"]["collective"] == "trees"
    assert max_relative_difference(flat, plain) <= 1e-5


def test_a_bad_topology_file_fails_the_job_naming_the_field(tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    job = write_job(
        tmp_path,
        schedule="1f1b-flush",
        microbatches=MICRO,
        batch_size=BATCH,
        steps=1,
        stages=[(0, 8)],
        replicas=[2],
        sections='[sync]\ncollective = "trees"\ntopology = "missing.json"\n',
    )
    with pytest.raises(AssertionError, match="sync.topology"):
        run_job(job, 2, timeout_s=200)
