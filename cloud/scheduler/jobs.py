"""A job as the scheduler sees it: demand, progress, attained service, measured throughput, status.

Backends own the ``JobState`` objects and change them only through the transition methods below
(``start``, ``preempt``, ``finish``, ``refuse``, ``progress``); a scheduling round only reads them.

``throughput[generation]`` is the job's measured rate in steps per second on that generation at its
full demand (``devices`` devices). A job spread over several generations runs at the slowest of
them (synchronous data parallelism waits for its slowest worker).

Invariant: ``steps_done <= total_steps``; ``attained_service`` (device-seconds) equals the sum of
``service_by_generation``; a job has a placement exactly while it is "running".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

JobStatus = Literal["queued", "running", "preempted", "done", "refused"]
ACTIVE: frozenset[JobStatus] = frozenset({"queued", "running", "preempted"})


@dataclass
class JobState:
    job_id: str
    devices: int  # demand: the job runs on exactly this many devices (gang-scheduled)
    submitted_at: float
    total_steps: int
    throughput: dict[str, float] = field(default_factory=dict)  # generation -> steps/s, measured
    user: str = "default"
    kind: str = ""  # the job's model/type (traces use it to share throughputs)
    steps_done: float = 0.0
    attained_service: float = 0.0  # device-seconds received so far
    service_by_generation: dict[str, float] = field(default_factory=dict)
    status: JobStatus = "queued"
    placement: tuple[str, ...] = ()
    preemptions: int = 0
    admitted: bool = False  # set by the backend once a round's plan admitted it
    started_at: float | None = None  # first start
    finished_at: float | None = None
    last_started_at: float | None = None  # start of the current (or last) run
    waiting_since: float = 0.0  # when it last became queued or preempted
    refusal: str = ""

    def __post_init__(self) -> None:
        if not self.job_id:
            raise ValueError("job_id: must not be empty")
        if self.devices < 1:
            raise ValueError(f"devices: {self.devices} for job {self.job_id!r}; must be >= 1")
        if self.total_steps < 1:
            raise ValueError(f"total_steps: {self.total_steps} for job {self.job_id!r}; must be >= 1")
        for generation, rate in self.throughput.items():
            if not rate > 0:
                raise ValueError(f"throughput[{generation!r}]: {rate} for job {self.job_id!r}; must be > 0")
        if self.status == "queued" and not self.waiting_since:
            self.waiting_since = self.submitted_at

    # -- reading ---------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def remaining_steps(self) -> float:
        return max(0.0, self.total_steps - self.steps_done)

    def rate_on(self, generations: Iterable[str]) -> float | None:
        """Steps/s on a placement spanning ``generations``: the slowest of them. A generation not
        measured yet counts as the slowest measured one; None when nothing is measured."""
        if not self.throughput:
            return None
        slowest_known = min(self.throughput.values())
        rates = [self.throughput.get(g, slowest_known) for g in generations]
        return min(rates) if rates else None

    def remaining_time(self, generation: str | None = None) -> float | None:
        """Seconds left on ``generation`` (None: on its fastest measured one); None if unmeasured."""
        rate = self.rate_on([generation]) if generation else self.best_rate()
        return None if rate is None else self.remaining_steps / rate

    def best_rate(self) -> float | None:
        return max(self.throughput.values()) if self.throughput else None

    # -- transitions (backends only) ---------------------------------------------------------------
    def start(self, now: float, placement: tuple[str, ...]) -> None:
        if self.status not in ("queued", "preempted"):
            raise ValueError(f"start: job {self.job_id!r} is {self.status}")
        if len(placement) != self.devices:
            raise ValueError(f"start: job {self.job_id!r} needs {self.devices} devices, got {len(placement)}")
        self.status, self.placement, self.admitted = "running", tuple(placement), True
        self.last_started_at = now
        if self.started_at is None:
            self.started_at = now

    def preempt(self, now: float) -> None:
        if self.status != "running":
            raise ValueError(f"preempt: job {self.job_id!r} is {self.status}")
        self.status, self.placement, self.waiting_since = "preempted", (), now
        self.preemptions += 1

    def finish(self, now: float) -> None:
        if self.status != "running":
            raise ValueError(f"finish: job {self.job_id!r} is {self.status}")
        self.status, self.placement, self.finished_at = "done", (), now
        self.steps_done = float(self.total_steps)

    def refuse(self, now: float, reason: str) -> None:
        if self.status != "queued":
            raise ValueError(f"refuse: job {self.job_id!r} is {self.status}")
        self.status, self.refusal, self.finished_at = "refused", reason, now

    def progress(self, seconds: float, steps: float, generation: str) -> None:
        """Account ``seconds`` of running on ``generation`` that made ``steps`` steps."""
        if seconds < 0 or steps < 0:
            raise ValueError(f"progress: negative seconds {seconds} or steps {steps} for job {self.job_id!r}")
        service = seconds * self.devices
        self.attained_service += service
        self.service_by_generation[generation] = self.service_by_generation.get(generation, 0.0) + service
        self.steps_done = min(float(self.total_steps), self.steps_done + steps)

    def measured(self, generation: str, steps_per_s: float) -> None:
        """Record a throughput measurement (the real backend's progress events)."""
        if not steps_per_s > 0:
            raise ValueError(
                f"throughput[{generation!r}]: {steps_per_s} for job {self.job_id!r}; must be > 0"
            )
        self.throughput[generation] = steps_per_s
