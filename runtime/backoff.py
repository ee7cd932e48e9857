"""Retry delays: exponential backoff with jitter, the one rule every retry loop in edgefed follows.

After the n-th consecutive failure the base delay is ``min(max_s, initial_s * 2**(n-1))`` and the
delay returned is drawn uniformly from ``[base/2, base]`` ("equal jitter"): peers that failed
together spread out, and no delay exceeds ``max_s``. A success resets the count.

Invariant: every delay ``failed()`` or ``longest()`` returns lies in ``[initial_s/2, max_s]``;
the random stream is injected, so a seeded ``rng`` gives the same delays every run.
"""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        if not 0 < initial_s <= max_s:
            raise ValueError(f"backoff needs 0 < initial_s <= max_s, got {initial_s} and {max_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self.failures = 0
        self._rng = rng if rng is not None else random.Random()

    @property
    def base_s(self) -> float:
        """The base delay of the current failure streak (0 before the first failure)."""
        if self.failures == 0:
            return 0.0
        return min(self.max_s, self.initial_s * 2.0 ** min(self.failures - 1, 64))

    @property
    def at_max(self) -> bool:
        """True once the base delay has reached ``max_s``."""
        return self.base_s >= self.max_s

    def failed(self) -> float:
        """Count one more failure and return how long to wait before the next try."""
        self.failures += 1
        return self._jittered(self.base_s)

    def longest(self) -> float:
        """Count one more failure, one that should wait as long as allowed (a refusal, a link known
        down), and return that wait."""
        self.failures += 1
        return self._jittered(self.max_s)

    def succeeded(self) -> None:
        """End the failure streak: the next failure waits about ``initial_s`` again."""
        self.failures = 0

    def _jittered(self, base_s: float) -> float:
        return base_s * (0.5 + 0.5 * self._rng.random())
