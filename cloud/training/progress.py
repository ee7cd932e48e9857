"""The job's progress file: rank 0's JSON lines (``ProgressLog``) and the ``step`` line each
``log_every`` steps sums up (``ProgressWindow``): loss, samples/s and steps/s, per-stage busy/idle seconds,
and the live figures of the features that run (``compression``, ``sync``, ``balance``, ``toggle``).

Invariant: every rank calls ``ProgressWindow.write`` at the same steps (it gathers from all ranks);
only rank 0 writes; a ``step`` line's figures cover the steps since the previous one.
"""

from __future__ import annotations

import fcntl
import json
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist

from cloud.training import comm
from cloud.training.compression.stage import StageCompression
from cloud.training.data.stream import MinibatchStream
from cloud.training.executor import StepStats
from cloud.training.features import StageFeatures
from cloud.training.schedules import Topology


class ProgressLog:
    """Rank 0's JSON-lines progress file (appended, flushed per line) plus a human line on stdout."""

    def __init__(self, path: str, enabled: bool):
        self.path, self.enabled = Path(path), enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, **fields) -> None:
        if not self.enabled:
            return
        record = {"event": event, "time": round(time.time(), 3), **fields}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        human = " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items() if k != "stages"
        )
        print(f"[train] {event} {human}", flush=True)


def write_refusal(path: str, code: int, message: str) -> None:
    """The ``error`` line for a refusal every rank reaches on its own (a device the job cannot have):
    whichever rank gets there first writes it, once. Not rank 0 only: torchrun stops the other ranks
    as soon as one exits, and on a loaded box rank 0 may still be importing torch then."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        handle.seek(0)
        lines = [line for line in handle if line.strip()]
        if lines and json.loads(lines[-1]).get("message") == message:  # another rank was first
            return
        handle.write(
            json.dumps({"event": "error", "time": round(time.time(), 3), "code": code, "message": message})
            + "\n"
        )


# StepStats fields summed per rank over a window, in the gathered table's column order
_COLUMNS = ("busy_s", "idle_s", "loss_sum", "n_losses", "bytes_sent", "wire_bytes_fp32", "wire_bytes_sent")


class ProgressWindow:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.sums = [0.0] * len(_COLUMNS)
        self.samples = self.steps = 0
        self.started = time.perf_counter()

    def add(self, stats: StepStats, samples: int) -> None:
        self.sums = [total + getattr(stats, name) for total, name in zip(self.sums, _COLUMNS, strict=True)]
        self.samples += samples
        self.steps += 1

    def write(
        self,
        progress: ProgressLog,
        features: StageFeatures,
        topology: Topology,
        stage: int,
        step: int,
        stream: MinibatchStream,
    ) -> float:
        """Every rank: gather the window, write the ``step`` line (rank 0); returns the loss."""
        mine = torch.tensor(self.sums, dtype=torch.float64, device=comm.wire_device())
        gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)
        table = torch.stack(gathered).cpu()
        loss = float(table[:, 2].sum() / table[:, 3].sum())
        if not math.isfinite(loss):  # the caller stops the job; nothing more to gather
            return loss
        elapsed = time.perf_counter() - self.started
        per_stage = [
            {
                "stage": s,
                "busy_s": round(float(table[topology.stage_ranks(s), 0].sum()), 4),
                "idle_s": round(float(table[topology.stage_ranks(s), 1].sum()), 4),
            }
            for s in range(topology.n_stages)
        ]
        extra: dict[str, dict] = {}
        decisions: list[dict] = []
        if features.reports_compression:
            extra["compression"], decisions = _compression_window(
                features.compression, table, stage, step, loss
            )
        extra.update(features.live())
        epoch, index = stream.locate(step)
        progress.write(
            "step",
            step=step,
            epoch=epoch + index / stream.epoch_steps(epoch),
            loss=loss,
            samples_per_s=self.samples / elapsed,
            steps_per_s=self.steps / elapsed,
            stages=per_stage,
            **extra,
        )
        for decision in decisions:
            progress.write("compression_decision", **decision)
        self._reset()
        return loss


def _compression_window(
    compression: StageCompression, table: torch.Tensor, stage: int, step: int, loss: float
) -> tuple[dict, list[dict]]:
    """Every rank calls this at a progress line: the adaptive controllers decide (same step on
    every rank), then rank 0 gathers each stage's bytes, formats and decisions."""
    compression.record_loss(loss)
    decisions = [{"stage": stage, **d} for d in compression.decide(step)]
    mine = {"stage": stage, **compression.report(), "decisions": decisions}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    formats, merged = {}, []
    for report in everyone:
        formats.update(report["formats"])
        merged += report["decisions"]
    summary = {
        "saved_bytes_fp32": sum(r["saved_bytes_fp32"] for r in everyone),
        "saved_bytes_stored": sum(r["saved_bytes_stored"] for r in everyone),
        "wire_bytes_fp32": int(table[:, 5].sum()),
        "wire_bytes_sent": int(table[:, 6].sum()),
        "encode_s": round(sum(r["encode_s"] for r in everyone), 4),
        "decode_s": round(sum(r["decode_s"] for r in everyone), 4),
        "formats": dict(sorted(formats.items())),
    }
    # A replica's decisions repeat its stage's (same layers, same losses): keep one per (stage, layer).
    unique = {(d["stage"], d["layer"]): d for d in merged}
    return summary, list(unique.values())
