"""Simulated power loss: record a workload's writes and fsyncs, build crash states from the trace,
recover each, and check the invariant (docs/storage.md, "Guarantee"). Every other state crashes
again: its recovery (and an epoch appended after it) is traced too, and a crash state of that trace,
built on the first state's files, is recovered and checked in turn.

EDGEFED_CRASH_STATES sets how many first-level states (default 250 in `make test`; the issue's
full count is EDGEFED_CRASH_STATES=2000).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
from pathlib import Path

import pytest

from gateway.storage import epoch_writer, meta
from gateway.storage.epoch_log import EpochLog
from gateway.storage.filelayer import FileLayer, OsFileLayer, RecordingFileLayer
from gateway.storage.recovery import recover_all
from tests.storage.storagetest_crash import build_crash_state
from tests.storage.storagetest_workload import check_prefix, payload

pytestmark = pytest.mark.slow  # a crash sweep: hundreds of power-loss states, each recovered

STATES = int(os.environ.get("EDGEFED_CRASH_STATES", "250"))
TRACES = 4
MAX_LEN = 300


async def _workload(directory: Path, layer: RecordingFileLayer, seed: int) -> None:
    rng = random.Random(seed)
    log = EpochLog(
        directory,
        segment_bytes=8 * 1024,
        max_bytes=1 << 20,
        file_layer=layer,
        rng=random.Random(seed),
        writer_threads=3,
    )
    await log.open()
    ends: list[int] = []
    for _ in range(rng.randrange(40, 70)):
        size, tag = rng.choice((1, 2, 3, 8, 20)), rng.getrandbits(32)
        for index in range(size):
            await log.append(payload(log.stats()["next_lsn"], tag, size, index, MAX_LEN))
        epoch = await log.flush(wait=rng.random() < 0.1)
        epoch.durable.add_done_callback(
            lambda f, last=epoch.last_lsn: f.exception() or layer.mark("durable", last)
        )
        ends.append(epoch.last_lsn)
        if rng.random() < 0.08:
            done = [end for end in ends if end <= log.durable_lsn]
            if done:
                await log.trim(done[len(done) // 2])
                layer.mark("trimmed", log.trimmed_lsn)
        await asyncio.sleep(0)
    await log.close()


async def _check_state(directory: Path, marks: dict[str, int], layer: FileLayer | None = None) -> str | None:
    """Recover ``directory`` (through ``layer``) and check it; then append and flush one epoch, the
    durability of which is marked in ``layer`` if it records."""
    full = recover_all(OsFileLayer(), str(directory))
    if full.damage is not None and full.damage.kind != "torn":
        return f"recovery reports {full.damage}"
    log = EpochLog(directory, segment_bytes=8 * 1024, max_bytes=1 << 20, close_timeout_s=5, file_layer=layer)
    await log.open()
    try:
        if log.recovery.damage or log.stats()["corruptions"]:
            return f"open reports {log.damage}"
        if log.durable_lsn < marks.get("durable", 0):
            return f"epoch up to lsn {marks['durable']} was notified durable; recovered {log.durable_lsn}"
        if log.trimmed_lsn < marks.get("trimmed", 0):
            return f"trim to {marks['trimmed']} returned; recovered trim point {log.trimmed_lsn}"
        records = [r async for r in log.read(0)]
        if records and (records[0][0] != log.trimmed_lsn + 1 or records[-1][0] != log.durable_lsn):
            return (
                f"read gave {records[0][0]}..{records[-1][0]}, log says {log.trimmed_lsn}..{log.durable_lsn}"
            )
        problem = check_prefix(records, MAX_LEN)
        if problem:
            return problem
        lsn = await log.append(payload(log.stats()["next_lsn"], 77, 1, 0, MAX_LEN))  # intake works
        await log.flush(wait=True)
        if isinstance(layer, RecordingFileLayer):
            layer.mark("durable", lsn)
        return None
    finally:
        await log.close()


async def _crash_during_recovery(state: Path, marks: dict[str, int], rng: random.Random) -> str | None:
    """Check ``state`` with its recovery traced, then a crash state of that trace built on its files."""
    base = state.with_name(state.name + "-base")
    shutil.copytree(state, base)
    layer = RecordingFileLayer(OsFileLayer())
    problem = await _check_state(state, marks, layer)
    if problem:
        return problem
    cut = rng.randrange(len(layer.trace) + 1)
    again = state.with_name(state.name + "-again")
    later = build_crash_state(layer.trace, cut, rng, state, again, base=base)
    merged = {tag: max(marks.get(tag, 0), later.get(tag, 0)) for tag in {*marks, *later}}
    problem = await _check_state(again, merged)
    return f"after a crash at {cut}/{len(layer.trace)} of recovery: {problem}" if problem else None


async def test_power_loss_crash_states(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(epoch_writer, "PARALLEL_MIN_BYTES", 2048)  # small groups use several regions too
    monkeypatch.setattr(meta, "LSN_RESERVE", 40)  # META reservations in every trace, between the writes
    problems: list[str] = []
    checked = nested = 0
    for trace_no in range(TRACES):
        source = tmp_path / f"src{trace_no}"
        layer = RecordingFileLayer(OsFileLayer())
        await _workload(source, layer, seed=trace_no)
        trace = layer.trace
        assert any(op.kind == "fsync" for op in trace)
        rng = random.Random(1000 + trace_no)
        count = STATES // TRACES + (1 if trace_no < STATES % TRACES else 0)
        for state_no in range(count):
            cut = rng.randrange(len(trace) + 1) if state_no else len(trace)
            target = tmp_path / f"state{trace_no}-{state_no}"
            marks = build_crash_state(trace, cut, rng, source, target, reorder=state_no % 4 != 0)
            if state_no % 2:
                problem = await _crash_during_recovery(target, marks, rng)
                nested += 1
            else:
                problem = await _check_state(target, marks)
            checked += 1
            if problem:
                problems.append(f"trace {trace_no} cut {cut}/{len(trace)}: {problem}")
    assert checked == STATES and nested >= (STATES - TRACES) // 2  # every other state of each trace
    assert not problems, f"{len(problems)} of {checked} crash states broke the invariant:\n" + "\n".join(
        problems[:10]
    )
