"""TrainingRunner: the ``training`` service inside gatewayd: the raw-vs-local choice, and acting on it.

    control plane (enabled, private) --apply--> decide: choose_training_mode(link, private, raw_Bps)
    placement plan / link change    --poke---->   train_locally -> FederatedClient (+ LocalTrainer thread)
                                                  upload_raw    -> RawForwarder (samples go up as records)

Owner: the daemon builds one runner (cheap: no torch) and connects the control plane's training
handler to ``apply``; each new placement plan calls ``poke``. The runner owns the private data log
(``<data_dir>/training/samples``, opened at the first enable, bounded by ``data_max_bytes``,
drop-oldest), the client, the trainer, the forwarder, and one watch task that re-decides every
``decide_interval_s`` or at once after ``poke``; ``stop`` ends them in reverse order and closes the log.

The decision is re-taken, and acted on, under one lock, so ``apply`` and the watch task never act at
the same time; a decision that changes the mode is logged and kept in a bounded list (``decisions``,
evictions counted). torch is imported only when local training is first decided, by a background task
in a thread (seconds on a small box): the event loop, the control plane and the daemon's start never
wait for it. Meanwhile the service is ``pending`` ("loading torch"); once loaded, the runner
re-decides and starts the client. The client module is taken from the load task once its import has
returned, never from ``sys.modules``, which holds a module from the moment its import *starts*: a
decision taken meanwhile saw a half-initialised module ("partially initialized module ... most
likely due to a circular import"). A state reached without an ``apply`` (torch loaded, the mode
changed with the link), goes to ``report``, so the control plane's retained state follows it;
``health`` says what is wrong with the running worker now (backing off: ``degraded``; torch would
not load: ``failed``), and a successful (re)start clears the error it replaced.

Invariant: whenever the lock is free, with training enabled exactly one of {client, forwarder} runs,
and it is the one the current decision (``status()["mode"]``) names; disabled, neither runs. While a
decision is being acted on (torch loading, say), ``status()["state"]`` still names what runs now.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from gateway.control.handlers import Applied
from gateway.federated.choice import LinkLike, TrainingChoice, choose_training_mode
from gateway.federated.forward import RawForwarder
from gateway.storage.epoch_log import EpochLog
from gateway.storage.interface import RecordLog
from protocol.config import TrainingConfig
from protocol.control import TrainingSettings
from runtime.tasks import cancel_and_wait, wait_event

if TYPE_CHECKING:  # both import torch: loaded by a background task, only once local training is decided
    from gateway.federated.client import FederatedClient
    from gateway.federated.trainer import LocalTrainer

log = logging.getLogger(__name__)

DECISIONS_KEPT = 20
CLIENT_MODULE = "gateway.federated.client"  # imports torch
TrainingState = Literal["training", "loading", "forwarding_raw", "stopped"]  # /status "training.state"


def declared_raw_Bps() -> float:
    """The raw bytes/s the placement catalog's training service declares (its ``collect`` output)."""
    from gateway.taskgraphs.catalog import training_graph

    return training_graph().output_rate_bytes("collect")


def open_sample_log(data_dir: Path, config: TrainingConfig) -> EpochLog:
    """The private data log of a gateway (not opened yet): ``<data_dir>/training/samples``, bounded by
    ``data_max_bytes``, drop-oldest. Whatever produces labelled samples appends them here (with
    ``gateway.federated.samples.sample_record``) while gatewayd is stopped: one writer per log."""
    budget = config.data_max_bytes
    return EpochLog(
        Path(data_dir) / "training" / "samples",
        segment_bytes=max(4096, budget // 8),
        max_bytes=budget,
        full_policy="drop_oldest",
        writer_threads=1,
    )


class TrainingRunner:
    def __init__(
        self,
        config: TrainingConfig,
        *,
        gateway_id: str,
        data_dir: Path,
        cloud_url: str,
        token: str | None,
        uplink_log: RecordLog,
        link_view: Callable[[], LinkLike],
        wake_uplink: Callable[[], None] | None = None,
        report: Callable[[Applied], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.gateway_id = gateway_id
        self.data_dir = Path(data_dir)
        self.directory = self.data_dir / "training"
        self._cloud_url, self._token = cloud_url, token
        self._uplink_log = uplink_log
        self._link_view = link_view
        self._wake_uplink = wake_uplink
        self._report = report
        self._reported: tuple[str, bool, str | None] | None = None  # what the control plane last heard
        self._clock = clock
        self.raw_Bps = config.raw_Bps if config.raw_Bps is not None else declared_raw_Bps()
        self.settings: TrainingSettings | None = None
        self.choice: TrainingChoice | None = None
        self.decided_ts: float | None = None  # when the current decision was first taken
        self.checked_ts: float | None = None  # when it was last re-taken
        self.trigger: str | None = None
        self.decisions: deque[dict[str, Any]] = deque(maxlen=DECISIONS_KEPT)
        self.decisions_dropped = 0
        self.decisions_total = 0
        self._data_log: EpochLog | None = None
        self._client: FederatedClient | None = None  # once torch is loaded
        self._trainer: LocalTrainer | None = None
        self._forwarder: RawForwarder | None = None
        self._client_running = False
        self._lock = asyncio.Lock()
        self._poke = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
        self._load_task: asyncio.Task[None] | None = None
        self._client_module: ModuleType | None = None  # set by the load task once the import returned
        self.load_error: str | None = None  # why the last load failed; None once one succeeded
        self.last_error: str | None = None  # of acting on a decision; cleared by the next success

    # --- the control plane and placement drive it ---------------------------------------------------

    async def apply(self, settings: TrainingSettings) -> Applied:
        if settings.enabled:
            self._ensure_watch()  # lives until stop(): a later disable leaves it idle
        async with self._lock:
            self.settings = settings
            applied = await self._converge("config")
            self._reported = self._report_key(applied)  # the control plane has this answer
            return applied

    def poke(self) -> None:
        """Re-decide now (a new placement plan: the link changed)."""
        self._poke.set()

    async def stop(self) -> None:
        for task in (self._watch_task, self._load_task):  # the load's thread finishes its import alone
            await cancel_and_wait(task)
        self._watch_task = self._load_task = None
        async with self._lock:
            await self._stop_workers()
            if self._trainer is not None:
                await asyncio.to_thread(self._trainer.close)  # ends a running round at its next step
                self._trainer = None
            if self._data_log is not None:
                await self._data_log.close()
                self._data_log = None

    def _ensure_watch(self) -> None:
        if self._watch_task is None:
            self._watch_task = asyncio.create_task(self._watch(), name="training-decide")

    async def _watch(self) -> None:
        while True:
            await wait_event(self._poke, self.config.decide_interval_s)
            self._poke.clear()
            async with self._lock:
                if self.settings is not None and self.settings.enabled:
                    try:
                        applied = await self._converge("link")
                        await self._tell(applied)
                    except Exception as exc:  # the watch must outlive a failed start; say why
                        self.last_error = f"{type(exc).__name__}: {exc}"
                        log.exception("training: acting on the decision failed")

    def _report_key(self, applied: Applied) -> tuple[str, bool, str | None]:
        """What makes a new state worth reporting: not the reason's figures, which move with the link."""
        return applied.state, applied.applied, self.choice.mode if self.choice is not None else None

    async def _tell(self, applied: Applied) -> None:
        """Report a state the service reached on its own (under the lock, so reports keep their order)."""
        key = self._report_key(applied)
        if key != self._reported and self._report is not None:
            self._reported = key
            await self._report(applied)

    # --- decide and act (under the lock) ------------------------------------------------------------

    def decide(self, private: bool) -> TrainingChoice:
        config = self.config
        return choose_training_mode(
            self._link_view(),
            private,
            raw_Bps=self.raw_Bps,
            max_link_share=config.max_link_share,
            min_up_fraction=config.min_up_fraction,
        )

    async def _converge(self, trigger: str) -> Applied:
        settings = self.settings
        assert settings is not None
        if not settings.enabled:
            await self._stop_workers()
            self._record(None, trigger)
            return Applied("stopped", True, "training disabled")
        choice = self.decide(settings.private)
        self._record(choice, trigger)
        try:
            await self._open_data_log()
            if choice.mode == "train_locally":
                await self._stop_forwarder()
                if not await self._start_client():
                    return Applied(
                        "pending",
                        False,
                        f"{choice}; loading torch: local training starts "
                        "in the background (/status training.state)",
                    )
            else:
                await self._stop_client()
                await self._start_forwarder()
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("training: could not act on %s", choice)
            return Applied("failed", False, f"{choice}: {self.last_error}")
        self.last_error = None  # what runs now runs: an earlier failure to start it is no longer true
        return Applied("running", True, str(choice))

    def _record(self, choice: TrainingChoice | None, trigger: str) -> None:
        """Keep the decision; log and list it when the mode changed."""
        self.checked_ts = self._clock()
        if choice == self.choice and self.decided_ts is not None:
            return  # the same decision again: when and why it was taken stay as they were
        before = self.choice.mode if self.choice is not None else None
        self.choice = choice
        self.decided_ts, self.trigger = self.checked_ts, trigger
        after = choice.mode if choice is not None else None
        if after == before:
            return
        link = self._link_view()
        entry = {
            "ts": round(self.decided_ts, 3),
            "trigger": trigger,
            "mode": after,
            "reason": choice.reason if choice is not None else "training disabled",
            "link": {
                "state": link.state,
                "goodput_Bps": round(link.goodput_Bps, 1),
                "up_fraction": round(link.up_fraction, 3),
            },
        }
        if len(self.decisions) == self.decisions.maxlen:
            self.decisions_dropped += 1
        self.decisions.append(entry)
        self.decisions_total += 1
        log.info("training mode %s -> %s (%s): %s", before, after, trigger, entry["reason"])

    async def _open_data_log(self) -> None:
        if self._data_log is not None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        data_log = open_sample_log(self.data_dir, self.config)
        await data_log.open()
        self._data_log = data_log

    async def _start_client(self) -> bool:
        """True once the client runs; False while torch is still loading in the background."""
        if self._client_running:
            return True
        if self._client is None:
            if self._client_module is None:
                if self._load_task is None or self._load_task.done():
                    self._load_task = asyncio.create_task(self._load(), name="training-load-torch")
                return False
            self._client = self._build_client(self._client_module)
        await self._client.start()
        self._client_running = True
        return True

    async def _load(self) -> None:
        """Import the client (and torch) in a thread, then have the watch task re-decide."""
        try:
            module = await asyncio.to_thread(importlib.import_module, CLIENT_MODULE)
        except Exception as exc:  # e.g. torch not installed: the service fails and says why
            self.load_error = f"cannot load local training: {type(exc).__name__}: {exc}"
            log.error("training: %s", self.load_error)
            return
        self._client_module, self.load_error = module, None
        self.poke()

    def _build_client(self, client_module: ModuleType) -> FederatedClient:
        """The client (and its trainer, kept in ``_trainer``), from the imported client module."""
        from gateway.federated.encoder import CodecSpec
        from gateway.federated.trainer import LocalTrainer
        from models.numerics import BfpFormat

        config = self.config
        codec = CodecSpec(
            config.codec,
            BfpFormat(block_size=config.block_size, mantissa_bits=config.mantissa_bits),
            topk_fraction=config.topk_fraction,
            error_feedback=config.error_feedback,
        )
        self._trainer = LocalTrainer(threads=config.threads, duty=config.duty)
        assert self._data_log is not None
        return client_module.FederatedClient(
            self.gateway_id,
            self._cloud_url,
            self._token,
            self._data_log,
            self._uplink_log,
            trainer=self._trainer,
            codec=codec,
            wake_uplink=self._wake_uplink,
            device="trainer",
            poll_interval_s=config.poll_interval_s,
            retrain_after_s=config.retrain_after_s,
            min_samples=config.min_samples,
            max_samples=config.max_samples,
            timeout_s=config.timeout_s,
            expect_model=config.model,
            expect_arch=config.arch,
        )

    async def _stop_client(self) -> None:
        if self._client_running:
            assert self._client is not None and self._trainer is not None, "a running client was built"
            self._trainer.interrupt()  # a round in progress ends at its next step, nothing is sent
            await self._client.stop()
            self._client_running = False

    async def _start_forwarder(self) -> None:
        if self._forwarder is None:
            assert self._data_log is not None
            self._forwarder = RawForwarder(
                self._data_log,
                self._uplink_log,
                self.directory / "forwarded.json",
                wake_uplink=self._wake_uplink,
                batch=self.config.forward_batch,
            )
        await self._forwarder.start()

    async def _stop_forwarder(self) -> None:
        if self._forwarder is not None:
            await self._forwarder.stop()

    async def _stop_workers(self) -> None:
        await self._stop_client()
        await self._stop_forwarder()

    # --- what it shows ------------------------------------------------------------------------------

    @property
    def state(self) -> TrainingState:
        if self._client_running:
            return "training"
        if self._load_task is not None and not self._load_task.done():
            return "loading"
        if self._forwarder is not None and self._forwarder.running:
            return "forwarding_raw"
        return "stopped"

    def _client_counters(self) -> dict[str, int]:
        if self._client is None:
            return {
                "rounds": 0,
                "updates_sent": 0,
                "payload_bytes": 0,
                "record_bytes": 0,
                "fetches": 0,
                "fetch_bytes": 0,
                "fetch_failures": 0,
                "wrong_model": 0,
                "errors": 0,
            }
        return dict(self._client.counters)

    def _forwarder_counters(self) -> dict[str, int]:
        if self._forwarder is None:
            return {"forwarded": 0, "forwarded_bytes": 0, "passes": 0, "uplink_full": 0, "errors": 0}
        return dict(self._forwarder.counters)

    def health(self) -> Applied | None:
        """What is wrong with the enabled service now (None: nothing): torch would not load (``failed``,
        retried at the next decision), or the running worker is backing off after an error (``degraded``)."""
        if self.settings is None or not self.settings.enabled:
            return None
        if self.load_error is not None:
            return Applied("failed", False, f"{self.choice}: {self.load_error}")
        if self._client_running:
            assert self._client is not None
            worker, failing = "the federated client", self._client.failing
        elif self._forwarder is not None and self._forwarder.running:
            worker, failing = "the raw forwarder", self._forwarder.failing
        else:
            return None
        if failing is None:
            return None
        return Applied("degraded", True, f"{self.choice}; {worker} is retrying after: {failing}")

    def _last_error(self) -> str | None:
        errors = [
            self.load_error,
            self.last_error,
            self._client.last_error if self._client is not None else None,
            self._forwarder.last_error if self._forwarder is not None else None,
        ]
        return next((e for e in reversed(errors) if e), None)

    def status(self) -> dict[str, Any]:
        settings = self.settings or TrainingSettings()
        client = self._client
        outcome = client.last_outcome if client is not None else None
        return {
            "enabled": settings.enabled,
            "private": settings.private,
            "state": self.state,
            "mode": self.choice.mode if self.choice is not None else None,
            "reason": self.choice.reason if self.choice is not None else None,
            "decided_ts": self.decided_ts,
            "checked_ts": self.checked_ts,
            "trigger": self.trigger,
            "raw_Bps": round(self.raw_Bps, 1),
            "decisions": list(self.decisions),
            "decisions_total": self.decisions_total,
            "decisions_dropped": self.decisions_dropped,
            "torch_loaded": "torch" in sys.modules,
            "samples": len(client.samples) if client is not None else None,
            "global_version": client.global_version if client is not None else None,
            "last_outcome": None
            if outcome is None
            else {"kind": outcome.kind, "detail": outcome.detail, "version": outcome.version},
            "client": self._client_counters(),
            "forwarder": self._forwarder_counters(),
            "last_error": self._last_error(),
        }

    def metrics(self) -> dict[str, float]:
        mode = self.choice.mode if self.choice is not None else None
        return {
            **self._client_counters(),
            **{f"raw_{k}": v for k, v in self._forwarder_counters().items()},
            "decisions": self.decisions_total,
            "enabled": float(bool(self.settings and self.settings.enabled)),
            "mode_local": float(mode == "train_locally"),
            "mode_raw": float(mode == "upload_raw"),
            "samples": float(len(self._client.samples)) if self._client is not None else 0.0,
        }


METRIC_GAUGES = {"enabled", "mode_local", "mode_raw", "samples"}
