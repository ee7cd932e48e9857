"""A real PostgreSQL for tests: its own cluster (``initdb`` + ``pg_ctl``) in a temp dir, on a free port.

Never the machine's shared server: the cluster listens on 127.0.0.1 at a port ``free_port`` found
and on a Unix socket inside its own directory, with ``trust`` authentication for local
connections. PostgreSQL refuses to run as root, so as root the cluster belongs to ``nobody``
(its directory is made outside pytest's 0700 tmp tree, chowned, and the commands run under
``runuser``). ``fsync=off``: the tests kill cloudd, never PostgreSQL, so the server's own
durability is not what they exercise (and the 2-core machine is shared); the fleet bench, which
compares it with SQLite (which syncs), starts it with ``fsync=True``.

``postgres_binaries()`` says why PostgreSQL cannot run here (None when it can); the ``postgresql``
fixture (tests/conftest.py) skips with that reason, and only then. Used by the store tests, the
replica test and the fleet bench.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.processes import free_port

BIN = Path("/usr/local/bin")
RUN_AS = "nobody"


def postgres_binaries() -> str | None:
    """None when initdb, pg_ctl and postgres are here; otherwise why not (a skip reason)."""
    missing = [name for name in ("initdb", "pg_ctl", "postgres") if not (BIN / name).exists()]
    if missing:
        return f"PostgreSQL binaries missing in {BIN}: {', '.join(missing)}"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root and runuser is missing (PostgreSQL will not run as root)"
    return None


@dataclass
class Postgres:
    """One running cluster; ``url(db)`` for clients, ``create_database`` for a fresh database."""

    root: Path
    port: int
    log_path: Path
    databases: list[str] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *argv: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
        command = list(argv)
        if os.geteuid() == 0:
            command = ["runuser", "-u", RUN_AS, "--", *command]
        return subprocess.run(
            command, cwd=self.root, capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return self.url(name)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop", timeout_s=60)
        shutil.rmtree(self.root, ignore_errors=True)


def start_postgres(*, fsync: bool = False) -> Postgres:
    """initdb a cluster in a temp dir of its own and start it; the caller stops it (``.stop()``).
    ``fsync=True`` for a benchmark that compares it with a store that syncs (module docstring)."""
    reason = postgres_binaries()
    if reason is not None:
        raise RuntimeError(reason)
    root = Path(tempfile.mkdtemp(prefix="edgefed-pg-"))
    server = Postgres(root=root, port=free_port(), log_path=root / "postgres.log")
    if os.geteuid() == 0:
        shutil.chown(root, RUN_AS)
    steps = (
        (str(BIN / "initdb"), "-D", str(server.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"),
        (
            str(BIN / "pg_ctl"),
            "-D",
            str(server.data),
            "-l",
            str(server.log_path),
            "-w",
            "-t",
            "120",
            "-o",
            f"-p {server.port} -k {root} -c listen_addresses=127.0.0.1 -c fsync={'on' if fsync else 'off'}"
            " -c max_connections=200",
            "start",
        ),
    )
    for argv in steps:
        done = server._run(*argv)
        if done.returncode != 0:
            log = server.log()
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(f"{Path(argv[0]).name} failed ({done.returncode}): {done.stderr}{log}")
    return server
