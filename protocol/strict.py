"""Strict types for payload fields that pydantic would otherwise let through in another JSON type.

pydantic checks a ``Literal[1]`` by equality, so ``true`` and ``1.0`` pass as the integer 1 even in a
model with ``strict=True`` (a literal takes no strict flag). ``SchemaVersion`` is the ``"v"`` of a
payload: a JSON integer, and 1, the only version there is.

Invariant: a field of a type defined here accepts one JSON type only: ``true`` is never the integer
1 and ``1.0`` never an integer.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, StrictInt

SCHEMA_VERSION = 1


def _is_the_schema_version(value: int) -> int:
    if value != SCHEMA_VERSION:
        raise ValueError(f"must be {SCHEMA_VERSION}, the schema version")
    return value


SchemaVersion = Annotated[StrictInt, AfterValidator(_is_the_schema_version)]
