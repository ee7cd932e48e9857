"""The model half of `make demo`: the camera's frames, uploaded by the gateway, labelled with the
simulator's ground truth, train a new scene model that goes through the gate and a canary rollout to
the gateway; the gateway's accuracy against the truth is measured before and after.

Steps, in order (``ModelLoop.run``): collect (frames the factory model answered, uploaded and
committed in cloudd, each labelled by devicesim's truth: devices/truth.py) -> dataset (the frames,
preprocessed as the gateway does, with their true labels: ``cloudctl datasets upload``) -> train (a
pipeline-parallel job on 2 ranks with BFP-compressed activations, starting from production's
weights) -> gate (its held-out frames, true labels, against the factory model) -> canary (``cloudctl
models promote --canary gw1``; the gateway swaps at its next assignment poll) -> after (frames the
new version answered).

Invariant: ``steps`` names each step that happened, in order; the loop stops at the first that did
not (``failed`` says which and why), and accuracy is only ever measured against devicesim's truth,
never against a model's verdict.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cloud.store.dataset import DatasetStore
from devices.truth import SceneTruth, scores

DATASET = "demo-scene-truth"
TRAIN_FLAGS = (
    "--model", "scene_cnn", "--dataset", f"upload:{DATASET}", "--test-fraction", "0.25",
    "--nproc", "2", "--stages", "2", "--batch-size", "16", "--microbatches", "4", "--compression", "bfp",
    "--epochs", "100", "--max-steps", "40", "--init-from", "production", "--optimizer", "adam",
    "--lr", "0.0005", "--log-every", "5",
)  # fmt: skip


@dataclass(frozen=True)
class Frame:
    capture_ts: float
    version: str
    label: str
    truth: str
    blob: Path | None  # the committed JPEG in cloudd, when uploaded


@dataclass
class LoopConfig:
    gateway: str
    cloud_data: Path
    cloud_url: str
    token: str
    ctl: Path
    truth: Path
    work: Path
    min_frames: int = 160
    after_frames: int = 60
    collect_timeout_s: float = 75.0
    swap_timeout_s: float = 30.0


@dataclass
class ModelLoop:
    config: LoopConfig
    steps: list[str] = field(default_factory=list)
    failed: str | None = None
    phase: str = "collect"
    version: str | None = None
    swapped_ts: float | None = None
    frames: list[Frame] = field(default_factory=list)
    gate: dict[str, Any] | None = None
    ambiguous: int = 0
    decision: str = ""

    def __post_init__(self) -> None:
        self.truth = SceneTruth(self.config.truth)

    # -- what cloudd stored -------------------------------------------------------------------
    def refresh(self) -> None:
        """Every classification event of the gateway's camera cloudd stored, labelled by truth."""
        self.truth.refresh()
        store = DatasetStore.open(self.config.cloud_data, readonly=True)
        frames, ambiguous = [], 0
        try:
            for stored in store.iter_records(self.config.gateway):
                body = stored.record.get("body", {})
                if stored.record.get("kind") != "event" or body.get("type") != "classification":
                    continue
                truth = self.truth.label_at(float(body["capture_ts"]))
                if truth is None:
                    ambiguous += 1
                    continue
                blob = body.get("blob") or {}
                path = self.config.cloud_data / "blobs" / self.config.gateway / str(blob.get("id"))
                committed = path if blob and path.is_file() else None
                frames.append(
                    Frame(float(body["capture_ts"]), body["model_version"], body["label"], truth, committed)
                )
        finally:
            store.close()
        self.frames, self.ambiguous = frames, ambiguous

    def before(self) -> list[Frame]:
        return [f for f in self.frames if f.version == "1"]

    def after(self) -> list[Frame]:
        swapped = self.swapped_ts or float("inf")
        return [f for f in self.frames if f.version == self.version and f.capture_ts >= swapped]

    def progress(self) -> str:
        uploaded = sum(1 for f in self.before() if f.blob is not None)
        after = f", {len(self.after())} by {self.version}" if self.swapped_ts else ""
        return f"[{self.phase}] frames in cloud: {uploaded} by the factory model{after}"

    # -- the steps ----------------------------------------------------------------------------
    async def run(self) -> bool:
        fresh = asyncio.create_task(self._keep_fresh())
        try:
            return await self._steps()
        finally:
            fresh.cancel()

    async def _keep_fresh(self) -> None:
        """The live view (``progress``) follows what cloudd stores while a step waits on other things."""
        while True:
            await asyncio.sleep(2.0)
            await asyncio.to_thread(self.refresh)

    async def _steps(self) -> bool:
        for name, step in (
            ("collect", self._collect),
            ("dataset", self._dataset),
            ("train", self._train),
            ("gate", self._gate),
            ("canary", self._canary),
            ("after", self._after),
        ):
            self.phase = name
            try:
                why = await step()
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                why = f"{type(exc).__name__}: {exc}"
            if why is not None:
                self.failed = f"{name}: {why}"
                print(f"model loop FAILED at {self.failed}", flush=True)
                return False
            self.steps.append(name)
        self.phase = "done"
        return True

    async def _wait_for(self, enough: Any, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await asyncio.to_thread(self.refresh)
            if enough():
                return True
            await asyncio.sleep(1.0)
        return False

    async def _collect(self) -> str | None:
        want = self.config.min_frames
        if await self._wait_for(
            lambda: sum(f.blob is not None for f in self.before()) >= want, self.config.collect_timeout_s
        ):
            return None
        return f"fewer than {want} frames uploaded in {self.config.collect_timeout_s:.0f}s"

    async def _dataset(self) -> str | None:
        out = self.config.work / f"{DATASET}.npz"
        rows = await asyncio.to_thread(
            write_truth_dataset, [f for f in self.before() if f.blob is not None], out
        )
        print(f"dataset: {rows} uploaded frames, labelled by devicesim's truth -> {out.name}", flush=True)
        code, _ = await self._ctl("datasets", "upload", DATASET, str(out))
        return None if code == 0 else f"cloudctl datasets upload exited {code}"

    async def _train(self) -> str | None:
        print(f"train: cloudctl train {' '.join(TRAIN_FLAGS)} --wait", flush=True)
        code, lines = await self._ctl("train", *TRAIN_FLAGS, "--wait", show="  train | ")
        job = lines[0].strip() if lines else ""
        doc = await self._get(f"/v1/jobs/{job}") if job else None
        if code != 0 or not doc or not doc.get("model"):
            return f"job {job or '?'} did not register a version (cloudctl exited {code})"
        self.version = doc["model"]["version"]
        return None

    async def _gate(self) -> str | None:
        doc = await self._get("/v1/models/scene") or {}
        entry = next((v for v in doc.get("versions", []) if v["version"] == self.version), None)
        self.gate = (entry or {}).get("evaluation")
        if not self.gate:
            return f"scene@{self.version} has no evaluation"
        base = self.gate.get("baseline") or {}
        print(
            f"gate: scene@{self.version} balanced accuracy {self.gate['value']:.3f} vs "
            f"scene@{base.get('version')} {base.get('value', float('nan')):.3f} on {self.gate['rows']} "
            f"held-out frames (true labels) -> promotable={self.gate['promotable']}",
            flush=True,
        )
        return None if self.gate["promotable"] else f"refused: {self.gate['reason']}"

    async def _canary(self) -> str | None:
        code, _ = await self._ctl(
            "models", "promote", "scene", str(self.version), "--canary", self.config.gateway
        )
        if code != 0:
            return f"cloudctl models promote exited {code}"
        promoted = time.time()
        if await self._wait_for(
            lambda: any(f.version == self.version and f.capture_ts >= promoted for f in self.frames),
            self.config.swap_timeout_s,
        ):
            self.swapped_ts = min(f.capture_ts for f in self.frames if f.version == self.version)
            print(f"canary: {self.config.gateway} runs scene@{self.version}", flush=True)
            return None
        return (
            f"{self.config.gateway} did not run scene@{self.version} within {self.config.swap_timeout_s:.0f}s"
        )

    async def _after(self) -> str | None:
        want = self.config.after_frames
        enough = await self._wait_for(lambda: len(self.after()) >= want, self.config.collect_timeout_s)
        doc = await self._get("/v1/models/scene") or {}
        last = (doc.get("history") or [{}])[-1]
        judged = (doc.get("rollout") or {}).get("reason")
        if last.get("version") == self.version and last.get("action") in ("production", "rollback"):
            self.decision = f"{last['action']} by {last.get('by')}: {last.get('reason')}"
        else:
            self.decision = f"still the canary ({judged or 'not judged yet'})"
        print(f"rollout: scene@{self.version} {self.decision}", flush=True)
        return None if enough else f"fewer than {want} frames answered by scene@{self.version}"

    # -- tools ----------------------------------------------------------------------------------
    async def _ctl(self, *args: str, show: str | None = None) -> tuple[int, list[str]]:
        proc = await asyncio.create_subprocess_exec(
            str(self.config.ctl),
            "--url",
            self.config.cloud_url,
            "--token",
            self.config.token,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert proc.stdout is not None
        lines = []
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            if line.startswith("registered:"):
                continue  # the whole registry entry; the job's last line names the version
            if show is not None or len(lines) > 1:
                shown = line if len(line) <= 150 else line[:147] + "..."
                print(f"{show or '  ctl | '}{shown}", flush=True)
        code = await proc.wait()
        if code != 0 and show is None:
            print("\n".join(f"  ctl | {line}" for line in lines[:1]), flush=True)
        return code, lines

    async def _get(self, path: str) -> dict[str, Any] | None:
        import aiohttp

        headers = {"Authorization": f"Bearer {self.config.token}"}
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.config.cloud_url + path, headers=headers) as resp,
        ):
            return await resp.json() if resp.status == 200 else None

    def report(self) -> list[str]:
        """The before/after lines: the gateway's verdicts against devicesim's truth."""
        lines = [f"rollout: scene@{self.version} {self.decision}"] if self.decision else []
        lines += [
            "scene accuracy on the camera's frames, against devicesim's ground truth "
            f"({self.ambiguous} frames captured near a scene change left out):"
        ]
        for what, frames in (
            ("before (factory scene@1)", self.before()),
            (f"after (scene@{self.version})", self.after()),
        ):
            accuracy, balanced, rows = scores((f.label, f.truth) for f in frames)
            lines.append(f"  {what:<28} accuracy {accuracy:6.3f}  balanced {balanced:6.3f}  on {rows} frames")
        return lines


def write_truth_dataset(frames: list[Frame], out: Path) -> int:
    """An .npz for ``cloudctl datasets upload``: x the frames preprocessed as the gateway does, y the
    index of each frame's true label in the scene model's labels."""
    import cv2

    from models.artifact import preprocess_images
    from models.scene import INPUT_SPEC
    from models.synthetic_scene import LABELS
    from protocol.events import InputSpec

    images = []
    for frame in frames:
        image = (
            cv2.imdecode(np.frombuffer(frame.blob.read_bytes(), np.uint8), cv2.IMREAD_COLOR)
            if frame.blob
            else None
        )
        if image is None:
            raise ValueError(f"frame {frame.blob}: not a JPEG OpenCV can decode")
        images.append(image)
    x = preprocess_images(images, InputSpec.model_validate(INPUT_SPEC)).astype(np.float32)
    y = np.array([LABELS.index(f.truth) for f in frames], dtype=np.int64)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, x=x, y=y)
    (out.with_suffix(".json")).write_text(json.dumps({"rows": len(y), "labels": list(LABELS)}))
    return len(y)
