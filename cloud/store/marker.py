"""The data directory's marker of where its metadata lives: ``<data_dir>/metadata-database``.

Segment files mean nothing without the metadata that names their committed lengths, so a data
directory is bound to one database. A writer on PostgreSQL writes the marker (the connection
string without its password) the first time and refuses a data directory bound elsewhere (another
PostgreSQL database, or a SQLite store: ``meta.sqlite`` beside it); a reader with no URL of its own
(a job's dataset step, ``DatasetStore.open(dir, readonly=True)``) opens the database it names,
taking a password from the environment (``PGPASSWORD``, which cloudd sets for its children).

Invariant: a data directory whose marker exists is written only by cloudd processes started with
that database.
"""

from __future__ import annotations

from pathlib import Path

from cloud.store.database import SQLITE_FILE, DatabaseError
from runtime.files import atomic_write

MARKER_FILE = "metadata-database"


def read(data_dir: Path) -> str | None:
    path = Path(data_dir) / MARKER_FILE
    return path.read_text().strip() if path.exists() else None


def claim(data_dir: Path, description: str) -> None:
    """Bind ``data_dir`` to the database ``description``, or refuse if it is bound to another."""
    data_dir = Path(data_dir)
    recorded = read(data_dir)
    if recorded is not None and recorded != description:
        raise DatabaseError(f"{data_dir} holds the store of PostgreSQL {recorded}, not of {description}")
    if recorded is None:
        if (data_dir / SQLITE_FILE).exists():
            raise DatabaseError(
                f"{data_dir} holds a SQLite store ({SQLITE_FILE}); cloudd does not move a store between "
                "databases: use a new data directory for PostgreSQL"
            )
        data_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(data_dir / MARKER_FILE, (description + "\n").encode())
