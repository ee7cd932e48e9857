"""Gateway inference: one onnxruntime session per loaded model artifact, run in a dedicated executor,
micro-batching whatever has queued while the previous batch ran; hot swap with verification.

Owner: whoever calls `InferenceEngine.start()` calls `stop()`; the engine owns its one worker task
and its executor. `submit` and `swap` are called on the event loop.

Swap: the new artifact's hash is checked, a session is built and run on a probe input off the
loop; only then is the active model replaced (one reference assignment on the loop), so the batch in
flight finishes on the old model and the next batch uses the new one. A failed load or probe
leaves the old model running and is reported (counter + last error + the returned value).

Figures and shadow: each swap starts a new ``ModelWindow`` (gateway/camera/figures.py) for the
version swapped in, and keeps the version it replaced loaded for ``shadow_s`` seconds as the shadow:
every ``shadow_every``-th frame the new version infers is run on the shadow too, in the same
executor, after its batch's results are out, so the shadow costs at most one inference in
``shadow_every`` for ``shadow_s`` seconds; the window counts how often the two labels agree.

Cost: the engine measures what one input costs here (docs/placement.md, "Measured costs"): the wall
seconds of each batch (timed in the executor thread) divided by its size, as the median of the last
``COST_WINDOW`` batches of the active model. A model that has not run yet (just loaded or swapped in,
or ``infer`` placed in the cloud from the start) has the median of ``PROBE_RUNS`` timed runs of its
probe input, after the load's own probe as a warm-up, until ``MIN_COST_BATCHES`` real batches
replace it; so the placement planner can learn that the edge is fast before it ever sends a frame here.

Invariant: every submitted item ends exactly once as a result, a drop (input queue full, oldest
first) or a failure (its batch raised): ``submitted == inferred + dropped + failed + pending``.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gateway.camera.figures import ModelWindow
from gateway.taskgraphs.profile import RunningMedian, profile_edge_cost
from models.artifact import ArtifactError, ModelArtifact
from models.inference import InferenceInput, Inferred, LoadedModel, load_and_probe, probe_input, run_batch
from runtime.tasks import cancel_and_wait

COST_WINDOW = 32  # batches in the running median of the cost per input
PROBE_RUNS = 5  # timed probe runs of a model just loaded
MIN_COST_BATCHES = 3  # real batches before they replace the probe's figure


@dataclass(frozen=True)
class Shadow:
    """The version a swap replaced, kept loaded until ``until`` (the engine's clock)."""

    model: LoadedModel
    until: float


@dataclass(frozen=True)
class SwapOutcome:
    ok: bool
    version: str
    reason: str = ""  # "", current, hash_mismatch, load_failed, probe_failed, download_failed, ...
    detail: str = ""


@dataclass
class InferenceCounters:
    submitted: int = 0
    dropped: int = 0
    inferred: int = 0
    failed: int = 0
    batches: int = 0
    largest_batch: int = 0
    results_dropped: int = 0
    swaps: int = 0
    swap_failures: int = 0
    last_error: str = ""


class InferenceEngine:
    def __init__(
        self,
        *,
        max_batch: int = 8,
        queue_size: int = 64,
        results_size: int = 1024,
        threads: int = 1,
        shadow_s: float = 600.0,
        shadow_every: int = 10,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.max_batch, self.queue_size, self.results_size = max_batch, queue_size, results_size
        self.threads = threads
        if shadow_every < 1:
            raise ValueError("shadow_every must be >= 1")
        self.shadow_s, self.shadow_every = shadow_s, shadow_every
        self.window: ModelWindow | None = None  # the running version's figures since it started
        self._shadow: Shadow | None = None
        self.counters = InferenceCounters()
        self._clock = clock
        self._timer = timer
        self._batch_costs = RunningMedian(COST_WINDOW)  # seconds per input, the active model's batches
        self._probe_cost_s: float | None = None  # the active model's probe runs, until batches replace it
        self._inputs: collections.deque[InferenceInput] = collections.deque()
        self._results: collections.deque[Inferred] = collections.deque()
        self._input_ready = asyncio.Event()
        self._result_ready = asyncio.Event()
        self._active: LoadedModel | None = None
        self._swap_lock = asyncio.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._worker: asyncio.Task | None = None
        self._in_flight = 0

    @property
    def active_version(self) -> str | None:
        return self._active.version if self._active else None

    @property
    def active_artifact(self) -> ModelArtifact | None:
        return self._active.artifact if self._active else None

    @property
    def shadow_version(self) -> str | None:
        """The version kept loaded after the last swap, while it still runs as the shadow."""
        self._expire_shadow()
        return self._shadow.model.version if self._shadow else None

    def cost_per_input(self) -> tuple[float | None, str]:
        """Seconds one input costs here, and from what: ``"batches"`` or ``"probe"`` (None: no model)."""
        if len(self._batch_costs) >= MIN_COST_BATCHES:
            return self._batch_costs.value, "batches"
        return self._probe_cost_s, "probe"

    def cost_status(self) -> dict[str, Any]:
        cost, source = self.cost_per_input()
        return {"cost_s_per_input": cost, "cost_from": source, "cost_batches": len(self._batch_costs)}

    def pending(self) -> int:
        return len(self._inputs) + self._in_flight

    def results_waiting(self) -> int:
        """Results made but not yet taken by ``next_result``."""
        return len(self._results)

    async def start(self, artifact: ModelArtifact) -> SwapOutcome:
        """Load the first model and start the worker; a failed first load is returned, not raised."""
        if self._worker is not None:
            raise RuntimeError("InferenceEngine already started")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")
        outcome = await self.swap(artifact)
        self._worker = asyncio.get_running_loop().create_task(self._work(), name="inference-worker")
        return outcome

    async def stop(self, drain_timeout: float = 5.0) -> None:
        """Finish what was submitted (up to ``drain_timeout``), then stop the worker and executor."""
        deadline = time.monotonic() + drain_timeout
        while self.pending() and self._active is not None and time.monotonic() < deadline:
            self._result_ready.clear()
            try:  # each finished batch sets the event; the cap re-checks a batch that failed silently
                wait_s = min(0.1, max(0.0, deadline - time.monotonic()))
                async with asyncio.timeout(wait_s):  # not wait_for: 3.11 may swallow a cancel
                    await self._result_ready.wait()
            except TimeoutError:
                pass
        await cancel_and_wait(self._worker)
        self._worker = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def submit(self, item: InferenceInput) -> bool:
        """Queue one input; when full the oldest queued input is dropped (counted). False if dropped."""
        self.counters.submitted += 1
        dropped = False
        if len(self._inputs) >= self.queue_size:
            self._inputs.popleft()
            self.counters.dropped += 1
            dropped = True
        self._inputs.append(item)
        self._input_ready.set()
        return not dropped

    async def next_result(self, within_s: float) -> Inferred | None:
        deadline = time.monotonic() + within_s
        while not self._results:
            self._result_ready.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                async with asyncio.timeout(remaining):  # not wait_for: 3.11 may swallow a cancel
                    await self._result_ready.wait()
            except TimeoutError:
                return None
        return self._results.popleft()

    async def swap(self, artifact: ModelArtifact) -> SwapOutcome:
        """Load, probe and run ``artifact`` from the next batch on; which version is the caller's
        business (gateway/camera/ota.py decides)."""
        async with self._swap_lock:
            loop = asyncio.get_running_loop()
            try:
                loaded, probe_cost_s = await loop.run_in_executor(
                    None, _load_and_time, artifact, self.threads, self._timer
                )
            except ArtifactError as exc:
                self.counters.swap_failures += 1
                self.counters.last_error = f"{artifact.name}@{artifact.version}: {exc}"
                return SwapOutcome(False, artifact.version, exc.reason, exc.detail)
            previous, self._active = self._active, loaded  # the swap: one assignment on the loop thread
            now = self._clock()
            self.window = ModelWindow(loaded.version, now)
            keep = previous is not None and previous.version != loaded.version and self.shadow_s > 0
            self._shadow = Shadow(previous, now + self.shadow_s) if keep and previous else None
            self._batch_costs.clear()  # the old model's cost says nothing about this one
            self._probe_cost_s = probe_cost_s
            self.counters.swaps += 1
            self._input_ready.set()  # inputs that waited for a first model can run now
            return SwapOutcome(True, artifact.version)

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._inputs or self._active is None:
                self._input_ready.clear()
                try:
                    async with asyncio.timeout(1.0):  # not wait_for: 3.11 may swallow a cancel
                        await self._input_ready.wait()
                except TimeoutError:
                    pass
                continue
            # micro-batching: take what queued while the last batch ran, never wait for more
            batch = [self._inputs.popleft() for _ in range(min(self.max_batch, len(self._inputs)))]
            model = self._active  # snapshot: a swap during this batch affects the next one
            self._in_flight = len(batch)
            try:
                results, seconds = await loop.run_in_executor(
                    self._executor, _timed_batch, model, batch, self._timer
                )
                current = model is self._active  # a batch that ended on a swapped-out model is not its cost
                if current:
                    self._batch_costs.add(seconds / len(batch))
            except Exception as exc:
                self.counters.failed += len(batch)
                self.counters.last_error = f"batch failed on {model.version}: {exc}"[:300]
                results, current = [], False
                if model is self._active and self.window is not None:
                    self.window.add_failed(len(batch))
            finally:
                self._in_flight = 0
            self.counters.batches += 1
            self.counters.largest_batch = max(self.counters.largest_batch, len(batch))
            self.counters.inferred += len(results)
            for result in results:
                if len(self._results) >= self.results_size:
                    self._results.popleft()
                    self.counters.results_dropped += 1
                self._results.append(result)
            self._result_ready.set()
            if current and self.window is not None:
                await self._observe(self.window, results, seconds)

    async def _observe(self, window: ModelWindow, results: list[Inferred], seconds: float) -> None:
        """Add a batch the running version ran to its window, and run the shadow on its sample."""
        sample = window.shadow_sample(len(results), self.shadow_every) if self.shadow_version else []
        window.add_batch([r.event.score for r in results], seconds)
        if not sample or self._shadow is None:
            return
        items = [results[i].item for i in sample]
        try:
            shadowed = await asyncio.get_running_loop().run_in_executor(
                self._executor, run_batch, self._shadow.model, items
            )
        except Exception:  # the shadow's trouble is not the running version's error rate
            window.shadow_failures += len(items)
            return
        agreed = sum(s.event.label == results[i].event.label for s, i in zip(shadowed, sample, strict=True))
        window.add_shadow(agreed, len(sample))

    def _expire_shadow(self) -> None:
        if self._shadow is not None and self._clock() >= self._shadow.until:
            self._shadow = None  # its session is freed with it


def _load_and_time(
    artifact: ModelArtifact, threads: int, timer: Callable[[], float]
) -> tuple[LoadedModel, float]:
    """Blocking: load and probe (``load_and_probe``), then time the probe input: seconds per input."""
    model = load_and_probe(artifact, threads)  # its probe run is the warm-up
    try:
        cost = profile_edge_cost(
            lambda item: run_batch(model, [item]), probe_input(artifact), PROBE_RUNS, warmup=0, clock=timer
        )
    except Exception as exc:  # it ran once in load_and_probe; failing now is still a probe failure
        raise ArtifactError("probe_failed", str(exc)[:300]) from None
    return model, cost


def _timed_batch(
    model: LoadedModel, batch: list[InferenceInput], timer: Callable[[], float]
) -> tuple[list[Inferred], float]:
    """Blocking: ``run_batch`` and its wall seconds, timed in the thread that runs it."""
    start = timer()
    results = run_batch(model, batch)
    return results, timer() - start


async def feed_from_camera(source: Any, engine: InferenceEngine, *, poll_s: float = 0.5) -> int:
    """Move delivered camera frames into the engine until the source is finished; returns the count.
    Run it as one task owned by whoever owns both ``source`` (a CameraSource) and ``engine``."""
    fed = 0
    while not source.finished:
        frame = await source.get(poll_s)
        if frame is None:
            continue
        engine.submit(InferenceInput(frame.camera_id, frame.seq, frame.capture_ts, frame.image, frame.jpeg))
        fed += 1
    return fed
