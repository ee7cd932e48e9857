"""The argparse types of devicesim's numeric flags.

Invariant: a numeric flag out of its range is a usage error (exit 2, one line naming the flag and
the range), never a run that quietly does nothing or never ends (``--fps 0`` made the scene planner
loop for ever, eating memory).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An int in [low, high] (either end open when None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        _within(value, text, low, high)
        return value

    return parse


def number(
    low: float | None = None, high: float | None = None, *, above: float | None = None
) -> Callable[[str], float]:
    """A finite float in [low, high], or above ``above`` (exclusive) when given."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"must be more than {above:g}, not {text}")
        _within(value, text, low, high)
        return value

    return parse


def _within(value: float, text: str, low: float | None, high: float | None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"from {low:g} to {high:g}" if low is not None and high is not None else None
        span = span or (f"at least {low:g}" if low is not None else f"at most {high:g}")
        raise argparse.ArgumentTypeError(f"must be {span}, not {text}")


PORT = integer(1, 65535)


def readable_file(text: str) -> Path:
    """A file this process can open for reading (a password, a CA, a certificate or key)."""
    try:
        with open(text, "rb"):
            return Path(text)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {exc.strerror or exc}") from None
