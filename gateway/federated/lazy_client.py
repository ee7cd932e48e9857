"""The ``train_locally`` worker of the training service: the federated client, built once torch loads.

torch is imported only when local training is first decided, by a background task in a thread
(seconds on a small box): the event loop, the control plane and the daemon's start never wait for
it. Meanwhile ``start`` returns False (the service is ``pending``, "loading torch"); once loaded,
``loaded`` is called (the runner re-decides and starts the client). The client module is taken from
the load task once its import has returned, never from ``sys.modules``, which holds a module from
the moment its import *starts*: a decision taken meanwhile saw a half-initialised module
("partially initialized module ... most likely due to a circular import"). An import that fails
leaves ``load_error`` set (the service fails and says why); the next ``start`` tries again.

Invariant: the client runs only once the client module's import has returned in the load task, and
at most one load task runs at a time; a stopped client's round in progress is interrupted, nothing
is sent.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from gateway.storage.interface import RecordLog
from protocol.config import TrainingConfig
from runtime.tasks import cancel_and_wait

# The client's counters (client.py counts them), named here so that a client not loaded yet reports
# them at zero without importing torch.
CLIENT_COUNTERS = (
    "rounds",
    "updates_sent",
    "payload_bytes",
    "record_bytes",
    "fetches",
    "fetch_bytes",
    "fetch_failures",
    "wrong_model",
    "errors",
)

if TYPE_CHECKING:  # both import torch: loaded by the load task, only once local training is decided
    from gateway.federated.client import FederatedClient
    from gateway.federated.trainer import LocalTrainer

log = logging.getLogger(__name__)

CLIENT_MODULE = "gateway.federated.client"  # imports torch


class LazyClient:
    """Owns the load task, the client and its trainer (the runner calls it under its lock)."""

    def __init__(
        self,
        config: TrainingConfig,
        *,
        gateway_id: str,
        cloud_url: str,
        token: str | None,
        uplink_log: RecordLog,
        wake_uplink: Callable[[], None] | None,
        loaded: Callable[[], None],
    ) -> None:
        self.config = config
        self._gateway_id = gateway_id
        self._cloud_url, self._token = cloud_url, token
        self._uplink_log = uplink_log
        self._wake_uplink = wake_uplink
        self._loaded = loaded
        self.client: FederatedClient | None = None  # once torch is loaded
        self._trainer: LocalTrainer | None = None
        self.running = False
        self._load_task: asyncio.Task[None] | None = None
        self._client_module: ModuleType | None = None  # set by the load task once the import returned
        self.load_error: str | None = None  # why the last load failed; None once one succeeded

    @property
    def loading(self) -> bool:
        return self._load_task is not None and not self._load_task.done()

    async def start(self, data_log: RecordLog) -> bool:
        """True once the client runs; False while torch is still loading in the background."""
        if self.running:
            return True
        if self.client is None:
            if self._client_module is None:
                if self._load_task is None or self._load_task.done():
                    self._load_task = asyncio.create_task(self._load(), name="training-load-torch")
                return False
            self.client = self._build_client(self._client_module, data_log)
        await self.client.start()
        self.running = True
        return True

    async def stop(self) -> None:
        if self.running:
            assert self.client is not None and self._trainer is not None, "a running client was built"
            self._trainer.interrupt()  # a round in progress ends at its next step, nothing is sent
            await self.client.stop()
            self.running = False

    async def cancel_load(self) -> None:
        await cancel_and_wait(self._load_task)  # the load's thread finishes its import alone
        self._load_task = None

    async def close(self) -> None:
        """After ``stop``: end the trainer's thread (a running round ends at its next step)."""
        if self._trainer is not None:
            await asyncio.to_thread(self._trainer.close)
            self._trainer = None

    def counters(self) -> dict[str, int]:
        if self.client is None:
            return dict.fromkeys(CLIENT_COUNTERS, 0)
        return dict(self.client.counters)

    async def _load(self) -> None:
        """Import the client (and torch) in a thread, then have the runner re-decide."""
        try:
            module = await asyncio.to_thread(importlib.import_module, CLIENT_MODULE)
        except Exception as exc:  # e.g. torch not installed: the service fails and says why
            self.load_error = f"cannot load local training: {type(exc).__name__}: {exc}"
            log.error("training: %s", self.load_error)
            return
        self._client_module, self.load_error = module, None
        self._loaded()

    def _build_client(self, client_module: ModuleType, data_log: RecordLog) -> FederatedClient:
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
        return client_module.FederatedClient(
            self._gateway_id,
            self._cloud_url,
            self._token,
            data_log,
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
