"""Pipeline training across nodes for real: one network namespace per node (tests/harness/netns.py),
torchrun with c10d rendezvous on each through deploy/torchrun/launch.sh, one stage per node.

- The two-node job ends with the parameters of gradient accumulation on one process (the same
  reference the single-node pipeline tests use), over links capped at 200 Mbit/s (tc tbf: this VM's
  kernel has no sch_netem; ``nodes(qdisc="netem delay ...")`` works where it has).
- A node SIGKILLed mid-job: the other fails, both are started again with the same command, and the
  job resumes from the last complete checkpoint on the shared folder and ends with the parameters of
  uninterrupted training.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cloud.jobs.torchrun import kill_job, read_progress
from tests.harness.netns import NetnsUnavailable, Node, nodes
from tests.harness.pipeline_reference import (
    max_relative_difference,
    merged_checkpoint,
    reference_grad_accumulation,
)
from tests.harness.processes import REPO, repo_env
from tests.harness.torchrun import wait_for_event, write_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LAUNCH = REPO / "deploy" / "torchrun" / "launch.sh"
RDZV_PORT = 29400  # each node has its own network stack: the port is free on all of them
STAGES = [(0, 4), (5, 8)]  # one per node
BATCH, MICRO = 16, 2
LINK = "tbf rate 200mbit burst 32kbit latency 50ms"


@pytest.fixture
def cluster():
    try:
        with nodes(2, qdisc=LINK) as made:
            yield made
    except NetnsUnavailable as exc:
        pytest.skip(f"no network namespaces here: {exc}")


def start_node(node: Node, job: Path, leader: Node, rdzv_id: str) -> subprocess.Popen[bytes]:
    """The same command on every node, as docs/training.md gives it; output in the job's folder."""
    argv = [str(LAUNCH), str(job), "2", "1", f"{leader.address}:{RDZV_PORT}", rdzv_id]
    log = open(job.parent / f"{node.namespace}.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            node.command(argv),
            cwd=job.parent,
            env=repo_env(
                PYTHON=sys.executable,
                OMP_NUM_THREADS="1",
                GLOO_SOCKET_IFNAME=node.interface,
                # the nodes share the host name: it cannot say which one hosts the store
                LOCAL_ADDR=node.address,
                RDZV_IS_HOST="1" if node == leader else "0",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # kill_job kills the group: the node's torchrun and its workers
        )
    finally:
        log.close()


def run_to_end(cluster: list[Node], job: Path, rdzv_id: str, timeout_s: float = 240) -> None:
    procs = [start_node(node, job, cluster[0], rdzv_id) for node in cluster]
    try:
        codes = [proc.wait(timeout_s) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_job(proc)
    logs = "\n".join((job.parent / f"{n.namespace}.log").read_text()[-3000:] for n in cluster)
    assert codes == [0, 0], f"torchrun exit codes {codes}:\n{logs}"


def test_two_nodes_train_as_one_process(cluster, tmp_path):
    steps = 12
    job = write_job(
        tmp_path, schedule="1f1b-flush", microbatches=MICRO, batch_size=BATCH, steps=steps, stages=STAGES
    )
    run_to_end(cluster, job, "multinode-equal")
    events = read_progress(tmp_path / "progress.jsonl")
    start = next(e for e in events if e["event"] == "start")
    assert start["world"] == 2
    assert events[-1] == {**events[-1], "event": "done", "step": steps}
    got = merged_checkpoint(tmp_path / "ckpt", len(STAGES), steps)
    want = reference_grad_accumulation(steps, BATCH, MICRO).state_dict()
    assert max_relative_difference(got, want) <= 1e-5


def test_a_killed_node_resumes_from_the_shared_checkpoint(cluster, tmp_path):
    steps = 40
    job = write_job(
        tmp_path,
        schedule="1f1b-flush",
        microbatches=MICRO,
        batch_size=BATCH,
        steps=steps,
        epochs=4,
        stages=STAGES,
        checkpoint_every=5,
        extra_train="comm_timeout_s = 30",  # the survivor gives up on its dead peer within this
    )
    leader, follower = (start_node(node, job, cluster[0], "multinode-kill") for node in cluster)
    try:
        first = wait_for_event(tmp_path / "progress.jsonl", "checkpoint", timeout_s=180, proc=leader)
        kill_job(follower)  # the second node dies: its torchrun and its worker, SIGKILL
        try:
            assert leader.wait(90) != 0  # the first node's worker loses its peer and the job fails
        except subprocess.TimeoutExpired:
            pytest.fail("the surviving node did not notice its dead peer within 90 s")
    finally:
        for proc in (leader, follower):
            if proc.poll() is None:
                kill_job(proc)
    assert not any(e["event"] == "done" for e in read_progress(tmp_path / "progress.jsonl"))

    run_to_end(cluster, job, "multinode-kill")  # the operator runs the same command again
    events = read_progress(tmp_path / "progress.jsonl")
    resumed = [e for e in events if e["event"] == "resume"]
    assert resumed and steps > resumed[-1]["from_step"] >= first["step"]
    assert events[-1] == {**events[-1], "event": "done", "step": steps}
    got = merged_checkpoint(tmp_path / "ckpt", len(STAGES), steps)
    want = reference_grad_accumulation(steps, BATCH, MICRO).state_dict()
    assert max_relative_difference(got, want) <= 1e-4  # as the single-node resume test (60 steps)
