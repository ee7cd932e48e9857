"""Estimators for samples whose noise is one-sided or that shift in level: the link monitor's filters.

Invariant: pure and deterministic: a filter's value depends only on the samples given, in order;
nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import math
import statistics
from collections import deque


class ShiftingEwma:
    """An EWMA (linear or in log space) that jumps to a new level once two samples in a row confirm it.

    A sample more than ``shift_ratio`` times above (or below) the estimate is *suspect*; when the
    next sample is suspect on the same side too, the estimate becomes the two samples' geometric
    mean and ``shifts`` counts it. Otherwise samples are averaged with weight ``alpha``.
    """

    def __init__(
        self, alpha: float, shift_ratio: float, *, log_space: bool, initial: float | None = None
    ) -> None:
        self.alpha = alpha
        self.shift_ratio = shift_ratio
        self.log_space = log_space
        self.value = initial
        self.shifts = 0
        self._suspect: tuple[int, float] | None = None  # (side: +1 above / -1 below, sample)

    def restart(self) -> None:
        """Forget the level: the next sample is taken as it is."""
        self.value, self._suspect = None, None

    def add(self, sample: float) -> float:
        old = self.value
        if old is None:
            self.value = sample
            return sample
        side = 1 if sample > old * self.shift_ratio else -1 if sample * self.shift_ratio < old else 0
        if side and self._suspect is not None and self._suspect[0] == side:
            self.value = math.sqrt(self._suspect[1] * sample)
            self.shifts += 1
            self._suspect = None
            return self.value
        self._suspect = (side, sample) if side else None
        if self.log_space:
            self.value = math.exp((1 - self.alpha) * math.log(old) + self.alpha * math.log(sample))
        else:
            self.value = (1 - self.alpha) * old + self.alpha * sample
        return self.value


class GoodputFilter:
    """Goodput from upload samples whose noise is one-sided: the estimate climbs freely, falls on evidence.

    A sample above the estimate is averaged in (log space, weight ``alpha``), or jumped to once two
    in a row are ``shift_ratio`` above it. A *censored* sample (a lower bound) below it says nothing.
    A *measured* sample below it is kept: two in a row ``shift_ratio`` below make the estimate jump
    to their geometric mean (a collapsed link, believed in two samples); otherwise the median of the
    last ``DRIFT_SAMPLES`` below, when ``DRIFT_RATIO`` under the estimate, replaces it (a slower link,
    believed once most recent measurements agree; one slow fsync in the time is not one).
    A sample above the estimate, or a censored one within ``shift_ratio`` of it, forgets the ones
    below (the link was just seen fast: the slow ones were the server's, not the link's).
    """

    DRIFT_SAMPLES = 4
    DRIFT_RATIO = 1.5  # the planner's goodput band: a smaller drift would not change a plan anyway

    def __init__(self, alpha: float, shift_ratio: float, prior: float) -> None:
        self.alpha = alpha
        self.shift_ratio = shift_ratio
        self.value = prior
        self.measured = False
        self.shifts = 0
        self._above: float | None = None  # the last sample, when it was shift_ratio above
        self._below: deque[float] = deque(maxlen=self.DRIFT_SAMPLES)  # measured, since the last above

    def restart(self, prior: float) -> None:
        """Back to ``prior``, unmeasured: the next sample is taken as it is."""
        self.value, self.measured = prior, False
        self._above = None
        self._below.clear()

    def add(self, sample: float, *, censored: bool) -> bool:
        """Take one sample; False when it told nothing (a lower bound under the estimate)."""
        if not self.measured:  # the prior is a guess, not a level to confirm a shift against
            self.value, self.measured = sample, True
            return True
        if sample > self.value:
            self._below.clear()
            if self._above is not None and sample > self.value * self.shift_ratio:
                self._jump(math.sqrt(self._above * sample))
            else:
                self._above = sample if sample > self.value * self.shift_ratio else None
                self.value = math.exp((1 - self.alpha) * math.log(self.value) + self.alpha * math.log(sample))
            return True
        self._above = None
        if censored:
            if sample * self.shift_ratio >= self.value:
                self._below.clear()  # a small upload at about the usual rate: the link did not collapse
            return False
        self._below.append(sample)
        last_two = list(self._below)[-2:]
        if len(last_two) == 2 and all(b * self.shift_ratio < self.value for b in last_two):
            self._jump(math.sqrt(last_two[0] * last_two[1]))
        elif len(self._below) == self.DRIFT_SAMPLES:
            median = statistics.median(self._below)
            if median * self.DRIFT_RATIO < self.value:
                self.value = median
                self._below.clear()
        return True

    def _jump(self, level: float) -> None:
        self.value = level
        self.shifts += 1
        self._above = None
        self._below.clear()
