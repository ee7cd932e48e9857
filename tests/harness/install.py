"""edgefed installed as a user installs it: a fresh virtual environment (``python -m venv``) and
``pip install -c constraints.txt <this checkout>``, as a wheel (not editable), so its programs run
the installed package and see only what its dependencies brought.

pip builds in the source tree (``build/``, ``*.egg-info``), so it builds from a copy of the checkout
in the installation's folder: the checkout is never written to. pip's cache is used as usual (PyPI,
or the machine's configured indexes, must be reachable the first time).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.harness.processes import REPO

# what a build does not need (and the checkout's own build output, which must not leak into the wheel)
NOT_BUILT = (".git", ".venv", "__pycache__", "build", "*.egg-info", ".*_cache", "tests", "bench", "docs")


@dataclass(frozen=True)
class Installation:
    bin: Path  # the venv's bin/
    env: dict[str, str]  # this process's environment without PYTHONPATH: nothing of the checkout leaks in

    def command(self, program: str) -> list[str]:
        """The argv of an installed program: the venv's ``python`` or a console script (``gatewayd``)."""
        return [str(self.bin / program)]

    def run(
        self, program: str, *args: str, cwd: Path, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess:
        """An installed program (``python``, ``gatewayd``, ...) to completion, from ``cwd``; output
        captured as text."""
        return subprocess.run(
            [*self.command(program), *args],
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )


def install_core(directory: Path, timeout_s: float = 600.0) -> Installation:
    """A venv in ``directory/venv`` with this checkout installed without extras (the gateway core);
    fails with pip's output if pip does."""
    source = directory / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_BUILT))
    venv = directory / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "-c", str(REPO / "constraints.txt"), str(source)],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert pip.returncode == 0, f"pip install {source} failed:\n{pip.stdout}\n{pip.stderr}"
    return Installation(venv / "bin", env)
