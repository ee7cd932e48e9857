"""What every benchmark shares: the ``--quick`` flag, the result table and its JSON file.

Benchmarks are modules of the ``bench`` package, run from the repository root as
``python -m bench.<name> [--quick]``; helpers (this file, ``_torchrun.py``) start with "_" so that
``make bench`` skips them.

Invariant: every figure printed is also in bench/results/<name>.json, and every ratio there is
ours over a baseline measured in the same run (higher is better), except the figures an issue named
among them that are rates or times, which the benchmark's docstring lists with their targets
(``bench.placement_live``: ``replans_per_min_steady``, ``flap_detect_s``; ``bench.ingest``:
``cpu_per_msg_vs_paho``, a cost over the baseline's; lower is better). The file's form:
``{"bench", "quick", "python", "torch", "cpus", "rows": [{"case", "system", "metric", "value"}],
"ratios": {name: value}}``, then any ``extra`` keys a benchmark adds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def parser(description: str) -> argparse.ArgumentParser:
    """The options every benchmark takes (``--quick``); a benchmark may add its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="same cases at smaller sizes (< 1 minute)")
    return parser


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    return parser(description).parse_args(argv)


@dataclass
class Results:
    bench: str
    quick: bool
    rows: list[dict] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)  # more keys, after the house form's

    def add(self, case: str, system: str, metric: str, value: float) -> None:
        self.rows.append({"case": case, "system": system, "metric": metric, "value": float(value)})

    def ratio(self, name: str, ours: float, baseline: float) -> float:
        """Record ours/baseline (callers invert times so that higher is better)."""
        value = ours / baseline if baseline else float("inf")
        self.ratios[name] = value
        return value

    def write(self, table: bool = True) -> Path:
        """Write bench/results/<bench>.json; print the rows and ratios first unless the benchmark
        printed its own table (``table=False``)."""
        if table:
            self._print()
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / f"{self.bench}.json"
        document = {
            "bench": self.bench,
            "quick": self.quick,
            "python": platform.python_version(),
            "torch": _torch_version(),
            "cpus": os.cpu_count(),
            "rows": self.rows,
            "ratios": self.ratios,
            **self.extra,
        }
        path.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {path}")
        return path

    def _print(self) -> None:
        columns = ("case", "system", "metric")
        widths = [max([len(k)] + [len(str(r[k])) for r in self.rows]) for k in columns]
        print("  ".join(k.ljust(w) for k, w in zip(columns, widths, strict=True)), "value")
        for row in self.rows:
            cells = [str(row[k]).ljust(w) for k, w in zip(columns, widths, strict=True)]
            print("  ".join(cells), f"{row['value']:.6g}")
        for name, value in self.ratios.items():
            print(f"ratio {name} = {value:.3f}")


def _torch_version() -> str | None:
    """The installed torch's version (without a local "+cpu" suffix), read without importing it."""
    try:
        from importlib.metadata import version

        return version("torch").split("+")[0]
    except Exception:
        return None
