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
evictions counted). torch is imported only when local training is first decided, in the background
(lazy_client.py): meanwhile the service is ``pending`` ("loading torch"); once loaded, the runner
re-decides and starts the client. A state reached without an ``apply`` (torch loaded, the mode
changed with the link), goes to ``report``, so the control plane's retained state follows it;
``health`` says what is wrong with the running worker now (backing off: ``degraded``; torch would
not load: ``failed``), and a successful (re)start clears the error it replaced.

Invariant: whenever the lock is free, with training enabled exactly one of {client, forwarder} runs,
and it is the one the current decision (``status()["mode"]``) names; disabled, neither runs. While a
decision is being acted on (torch loading, say), ``status()["state"]`` still names what runs now.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from gateway.control.handlers import Applied
from gateway.federated.choice import LinkLike, TrainingChoice, choose_training_mode
from gateway.federated.forward import RawForwarder
from gateway.federated.lazy_client import LazyClient
from gateway.storage.epoch_log import EpochLog
from gateway.storage.interface import RecordLog
from protocol.config import TrainingConfig
from protocol.control import TrainingSettings
from runtime.tasks import cancel_and_wait, wait_event

log = logging.getLogger(__name__)

DECISIONS_KEPT = 20
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
        self._local = LazyClient(  # train_locally: the client, once torch is loaded
            config,
            gateway_id=gateway_id,
            cloud_url=cloud_url,
            token=token,
            uplink_log=uplink_log,
            wake_uplink=wake_uplink,
            loaded=self.poke,
        )
        self._forwarder: RawForwarder | None = None  # upload_raw
        self._lock = asyncio.Lock()
        self._poke = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
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
        await cancel_and_wait(self._watch_task)
        self._watch_task = None
        await self._local.cancel_load()
        async with self._lock:
            await self._stop_workers()
            await self._local.close()
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
            data_log = await self._open_data_log()
            if choice.mode == "train_locally":
                await self._stop_forwarder()
                if not await self._local.start(data_log):
                    return Applied(
                        "pending",
                        False,
                        f"{choice}; loading torch: local training starts "
                        "in the background (/status training.state)",
                    )
            else:
                await self._local.stop()
                await self._start_forwarder(data_log)
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

    async def _open_data_log(self) -> EpochLog:
        if self._data_log is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            data_log = open_sample_log(self.data_dir, self.config)
            await data_log.open()
            self._data_log = data_log
        return self._data_log

    async def _start_forwarder(self, data_log: EpochLog) -> None:
        if self._forwarder is None:
            self._forwarder = RawForwarder(
                data_log,
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
        await self._local.stop()
        await self._stop_forwarder()

    # --- what it shows ------------------------------------------------------------------------------

    @property
    def state(self) -> TrainingState:
        if self._local.running:
            return "training"
        if self._local.loading:
            return "loading"
        if self._forwarder is not None and self._forwarder.running:
            return "forwarding_raw"
        return "stopped"

    def _forwarder_counters(self) -> dict[str, int]:
        if self._forwarder is None:
            return {"forwarded": 0, "forwarded_bytes": 0, "passes": 0, "uplink_full": 0, "errors": 0}
        return dict(self._forwarder.counters)

    def health(self) -> Applied | None:
        """What is wrong with the enabled service now (None: nothing): torch would not load (``failed``,
        retried at the next decision), or the running worker is backing off after an error (``degraded``)."""
        if self.settings is None or not self.settings.enabled:
            return None
        if self._local.load_error is not None:
            return Applied("failed", False, f"{self.choice}: {self._local.load_error}")
        if self._local.running:
            assert self._local.client is not None
            worker, failing = "the federated client", self._local.client.failing
        elif self._forwarder is not None and self._forwarder.running:
            worker, failing = "the raw forwarder", self._forwarder.failing
        else:
            return None
        if failing is None:
            return None
        return Applied("degraded", True, f"{self.choice}; {worker} is retrying after: {failing}")

    def _last_error(self) -> str | None:
        client = self._local.client
        errors = [
            self._local.load_error,
            self.last_error,
            client.last_error if client is not None else None,
            self._forwarder.last_error if self._forwarder is not None else None,
        ]
        return next((e for e in reversed(errors) if e), None)

    def status(self) -> dict[str, Any]:
        settings = self.settings or TrainingSettings()
        client = self._local.client
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
            "client": self._local.counters(),
            "forwarder": self._forwarder_counters(),
            "last_error": self._last_error(),
        }

    def metrics(self) -> dict[str, float]:
        mode = self.choice.mode if self.choice is not None else None
        client = self._local.client
        return {
            **self._local.counters(),
            **{f"raw_{k}": v for k, v in self._forwarder_counters().items()},
            "decisions": self.decisions_total,
            "enabled": float(bool(self.settings and self.settings.enabled)),
            "mode_local": float(mode == "train_locally"),
            "mode_raw": float(mode == "upload_raw"),
            "samples": float(len(client.samples)) if client is not None else 0.0,
        }


METRIC_GAUGES = {"enabled", "mode_local", "mode_raw", "samples"}
