"""``cloudctl train`` and ``cloudctl watch``: a job spec from flags and/or a file, and following a job.

The spec is a dict sent as JSON: the ``--file`` (TOML or JSON, the whole spec: docs/training.md,
"The job spec"), then each flag given on top (a flag left out leaves the file's value, or
cloudd's default). cloudd validates it (``cloud.jobs.spec``); cloudctl only shapes it, so that
every cloudctl command starts without pydantic's import time.

Invariant: ``spec_from_args`` is pure apart from reading ``--file``; a flag maps to exactly one
spec field (``--compression`` to ``compression.activations`` and ``compression.gist``, ``--toggle``
to ``toggle.enabled`` and ``toggle.fraction``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, TextIO

from cloud.ctl.http import CtlError, iter_events
from cloud.ctl.text import progress_line

# --compression: (compression.activations, compression.gist)
COMPRESSION_CHOICES: dict[str, tuple[str, bool]] = {
    "off": ("none", False),
    "bfp": ("bfp", False),
    "adaptive": ("adaptive", False),
    "gist": ("none", True),
    "bfp+gist": ("bfp", True),
    "adaptive+gist": ("adaptive", True),
}
# flag dest -> spec field, for the flags that are one field as they are
PLAIN_FLAGS = (
    "model",
    "dataset",
    "loss",
    "test_fraction",
    "nproc",
    "epochs",
    "schedule",
    "vertical_sync",
    "wire_codec",
    "precision",
    "device",
    "lr",
    "optimizer",
    "init_from",
    "batch_size",
    "microbatches",
    "max_steps",
    "seed",
    "log_every",
    "checkpoint_every",
    "registry_name",
)


def add_train_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    train = commands.add_parser("train", parents=[common], help="submit a training job; prints its id")
    train.add_argument("--file", type=Path, help="a whole job spec as TOML or JSON; flags given override it")
    # Names and choices are cloudd's to check (cloud.jobs.spec); the help says what they are.
    train.add_argument(
        "--model", help="digits_cnn | anomaly_autoencoder | scene_cnn | a factory package.module:function"
    )
    train.add_argument("--pythonpath", help="folder (on cloudd's machine) the factory imports from")
    train.add_argument("--dataset", help="digits | sensor_windows | camera_frames | upload:NAME")
    train.add_argument("--loss", help="cross_entropy | mse | reconstruction (uploads and factories)")
    train.add_argument("--test-fraction", type=float, help="rows held out for eval (uploads and factories)")
    train.add_argument("--nproc", type=int)
    train.add_argument("--epochs", type=int)
    train.add_argument("--schedule", help="gpipe | 1f1b-flush | 1f1b-stash")
    train.add_argument("--vertical-sync", action=argparse.BooleanOptionalAction, help="1f1b-stash only")
    train.add_argument("--stages", help="auto | a number of stages (layers split evenly)")
    train.add_argument("--replicas", help="auto | replicas per stage, comma-separated (e.g. 2,1)")
    train.add_argument(
        "--compression", choices=list(COMPRESSION_CHOICES), help="activations saved for backward"
    )
    train.add_argument("--wire-codec", help="fp32 | bfp8 | bfp6 | bfp4 (tensors between stages)")
    train.add_argument("--sync", action=argparse.BooleanOptionalAction, help="the barrier sync scheduler")
    train.add_argument("--balance", action=argparse.BooleanOptionalAction, help="rank balancing")
    train.add_argument(
        "--toggle", type=float, metavar="FRACTION", help="toggle-rate selection: share per epoch"
    )
    train.add_argument("--precision", help="fp32 | bf16")
    train.add_argument("--device", help="auto | cpu | cuda")
    train.add_argument("--lr", type=float)
    train.add_argument("--optimizer", help="sgd (momentum 0.9) | adam")
    train.add_argument(
        "--init-from", help="start from this registry version's weights (production: the production alias)"
    )
    train.add_argument("--batch-size", type=int)
    train.add_argument("--microbatches", type=int)
    train.add_argument("--max-steps", type=int)
    train.add_argument("--seed", type=int)
    train.add_argument("--log-every", type=int)
    train.add_argument("--checkpoint-every", type=int)
    train.add_argument("--registry-name", help="model name in the registry (default: the model's own)")
    train.add_argument(
        "--gateway",
        action="append",
        default=[],
        help="gateway-built datasets (sensor_windows, camera_frames): this gateway's uploads only",
    )
    train.add_argument(
        "--wait", action="store_true", help="follow the job to its end (exit 1 unless it succeeded)"
    )


def read_spec_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CtlError(f"--file {path}: {exc}") from None
    try:
        spec = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise CtlError(f"--file {path}: {exc}") from None
    if not isinstance(spec, dict):
        raise CtlError(f"--file {path}: a spec is an object (a TOML table)")
    return spec


def _stages(text: str) -> str | int:
    try:
        return text if text == "auto" else int(text)
    except ValueError:
        raise CtlError(f"--stages: {text!r} is neither auto nor a number") from None


def _replicas(text: str) -> str | list[int]:
    try:
        return text if text == "auto" else [int(part) for part in text.split(",")]
    except ValueError:
        raise CtlError(f"--replicas: {text!r} is neither auto nor counts like 2,1") from None


def spec_from_args(args: argparse.Namespace) -> dict[str, Any]:
    spec = read_spec_file(args.file) if args.file is not None else {}
    for key in PLAIN_FLAGS:
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    if args.pythonpath is not None:  # a relative folder means this shell's (cloudd on this machine)
        spec["pythonpath"] = str(Path(args.pythonpath).resolve())
    if args.stages is not None:
        spec["stages"] = _stages(args.stages)
    if args.replicas is not None:
        spec["replicas"] = _replicas(args.replicas)
    if args.gateway:
        spec["gateways"] = args.gateway

    def section(name: str) -> dict[str, Any]:
        return spec.setdefault(name, {}) if isinstance(spec.get(name, {}), dict) else spec[name]

    if args.compression is not None:
        activations, gist = COMPRESSION_CHOICES[args.compression]
        section("compression").update(activations=activations, gist=gist)
    for name in ("sync", "balance"):
        if getattr(args, name) is not None:
            section(name)["enabled"] = getattr(args, name)
    if args.toggle is not None:
        section("toggle").update(enabled=True, fraction=args.toggle)
    return spec


def watch(base: str, token: str | None, job_id: str, as_json: bool, out: TextIO = sys.stdout) -> int:
    """Follow a job to its end; 0 if it succeeded."""
    summary: dict[str, Any] = {"step": 0, "total_steps": None}
    tty, state, last_plain = out.isatty(), None, 0.0
    for kind, event in iter_events(f"{base}/v1/jobs/{job_id}/events", token):
        if as_json:
            print(json.dumps(event), file=out, flush=True)
        if kind == "start":
            summary["total_steps"] = event.get("total_steps")
        elif kind == "step":
            summary.update({k: event.get(k) for k in ("step", "loss", "samples_per_s")})
        elif kind == "eval":
            summary["accuracy"] = event.get("accuracy")
        elif kind == "state":
            state = event.get("state")
        if as_json:
            continue
        if tty and kind in ("step", "eval"):
            print("\r" + progress_line(summary), end="", file=out, flush=True)
        elif kind in ("step", "eval") and (
            time.monotonic() - last_plain >= 2.0 or summary["step"] == summary["total_steps"]
        ):
            print(progress_line(summary), file=out, flush=True)
            last_plain = time.monotonic()
        elif kind in ("state", "registered", "error"):
            detail = event.get("model") or event.get("error") or event.get("message") or ""
            text = f"{kind}: {event.get('state', '')} {json.dumps(detail) if detail else ''}".strip()
            print(("\n" if tty else "") + text, file=out, flush=True)
    return 0 if state == "succeeded" else 1
