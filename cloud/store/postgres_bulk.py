"""Many rows of one INSERT as one PostgreSQL statement: a column array each, through ``unnest``.

psycopg's ``executemany`` costs cloudd ~5-10 us of CPU per row (pipelined, one statement each),
and a batch of 50 records writes ~170 rows (samples, rollups, message rollups, devices).
``bulk_insert`` turns the house SQL ``INSERT INTO t [(cols)] VALUES (?, ...) [ON CONFLICT ...]``
into ``INSERT INTO t (cols) SELECT * FROM unnest(?::type[], ...) [ON CONFLICT ...]`` with the same
conflict clause, each column sent as the text of a PostgreSQL array literal (built by ``join``:
psycopg's own list dumpers spend as much Python per element as ``executemany`` per row), cast to
the table's own column type (read from the catalog).

Invariant: the rewritten statement changes the table exactly as ``executemany`` of the original
would. Where one statement could differ from one statement per row, ``bulk_insert`` answers None
and the caller keeps ``executemany``: ``ON CONFLICT ... DO UPDATE`` may not touch a row twice, so
rows that repeat its key; a value whose literal would not be the one psycopg sends (a float for an
integer column, which the server would round, a bool, a non-string for a text column); a column type
without an encoder here; every statement not of the form above.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_INSERT = re.compile(
    r"INSERT INTO (?P<table>\w+)\s*(?:\((?P<columns>[\w\s,]+)\))?\s*"
    r"VALUES\s*\((?P<marks>\s*\?(?:\s*,\s*\?)*\s*)\)(?P<rest>[^?]*)",
    re.DOTALL | re.IGNORECASE,
)
_UPDATE_TARGET = re.compile(r"ON CONFLICT\s*\((?P<key>[\w\s,]+)\)\s*DO UPDATE", re.DOTALL | re.IGNORECASE)

COLUMN_TYPES_SQL = (
    "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
    "WHERE a.attrelid = ?::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
)


def _literal(values: list[Any], quoted: bool) -> str | None:
    """The array literal of ``values`` (PostgreSQL's "Array Value Input"); None for a quoted column
    holding a NULL (none of the batch's do: left to executemany) or a NUL, which PostgreSQL's text
    cannot hold (psycopg refuses it in its own words)."""
    if not quoted:
        items = map(str, values) if None not in values else ("NULL" if v is None else str(v) for v in values)
        return "{" + ",".join(items) + "}"
    if None in values:
        return None
    # Escaped all at once, not value by value: joined by NUL, which no value holds.
    joined = "\0".join(values)
    if joined.count("\0") != len(values) - 1:
        return None
    escaped = joined.replace("\\", "\\\\").replace('"', '\\"')
    return '{"' + escaped.replace("\0", '","') + '"}'


# column type -> (the Python types its values may have, whether each is quoted; else str() as it is).
# str() of an int or float reads back as that value (repr: the shortest exact form, nan/inf included).
_ENCODERS: Mapping[str, tuple[frozenset[type], bool]] = {
    "text": (frozenset({str, type(None)}), True),
    "bigint": (frozenset({int, type(None)}), False),
    "integer": (frozenset({int, type(None)}), False),
    "double precision": (frozenset({float, int, type(None)}), False),
}


def bulk_insert(
    sql: str, rows: Sequence[Sequence[Any]], types_of: Callable[[str], Mapping[str, str]]
) -> tuple[str, list[str]] | None:
    """``(statement, literals)``: ``sql``'s rows as one statement in house SQL (``?`` placeholders),
    one array literal per column; None when only ``executemany`` keeps ``sql``'s meaning.

    ``types_of(table)``: the table's columns in order -> their PostgreSQL type (``COLUMN_TYPES_SQL``)."""
    match = _INSERT.fullmatch(sql.strip())
    if match is None or not rows:
        return None
    column_types = types_of(match["table"])
    columns = [c.strip() for c in match["columns"].split(",")] if match["columns"] else list(column_types)
    if match["marks"].count("?") != len(columns) or any(
        column_types.get(c) not in _ENCODERS for c in columns
    ):
        return None
    try:
        values = [list(column) for column in zip(*rows, strict=True)]
    except ValueError:
        return None  # rows of different lengths: executemany says so in its own words
    if len(values) != len(columns):
        return None
    if not _merges_each_row_once(match["rest"], columns, values):
        return None
    literals = []
    for column, column_values in zip(columns, values, strict=True):
        allowed, quoted = _ENCODERS[column_types[column]]
        literal = _literal(column_values, quoted) if set(map(type, column_values)) <= allowed else None
        if literal is None:
            return None
        literals.append(literal)
    casts = ", ".join(f"?::{column_types[c]}[]" for c in columns)
    statement = (
        f"INSERT INTO {match['table']} ({', '.join(columns)}) SELECT * FROM unnest({casts}){match['rest']}"
    )
    return statement, literals


def _merges_each_row_once(rest: str, columns: list[str], values: list[list[Any]]) -> bool:
    """Whether no two rows share the key of ``rest``'s ``ON CONFLICT (key) DO UPDATE`` (if any)."""
    target = _UPDATE_TARGET.search(rest)
    if target is None:
        return "DO UPDATE" not in rest.upper()  # else a conflict target this parser does not read
    key = [c.strip() for c in target["key"].split(",")]
    if any(c not in columns for c in key):
        return False
    keys = set(zip(*(values[columns.index(c)] for c in key), strict=True))
    return len(keys) == len(values[0])
