"""The upload batch: what a gateway POSTs to ``/v1/gateways/<gw>/batches``.

Body (``application/json``)::

    {"v": 1, "gateway": "gw1", "log_id": "3f2a...", "records": [{"lsn": 17, "data": <Record>}, ...]}

Headers: ``Authorization: Bearer <gateway token>`` and ``Idempotency-Key: <gw>:<log_id>:<first>-<last>``.
LSNs are strictly increasing inside a batch. ``log_id`` names one incarnation of the gateway's
log (a new log starts LSNs again), so (gateway, log_id, lsn) names a record for ever and the cloud
stores each at most once. The cloud answers 200 with ``BatchAck`` only after the records are
durably stored; a replayed batch gets the same 200 and stores nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from protocol.errors import ProtocolError
from protocol.records import Record
from protocol.telemetry import describe_validation_error
from protocol.topics import ID_PATTERN, check_id

MAX_BATCH_BYTES = 8 * 1024 * 1024
MAX_BATCH_RECORDS = 10_000


class BatchEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    lsn: int = Field(ge=1)
    data: Record


class UploadBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    v: Literal[1]
    gateway: str = Field(pattern=f"^{ID_PATTERN}$")
    log_id: str = Field(pattern=r"^[0-9a-f]{8,64}$")
    records: list[BatchEntry] = Field(min_length=1, max_length=MAX_BATCH_RECORDS)

    @model_validator(mode="after")
    def _increasing_lsns(self) -> UploadBatch:
        lsns = [entry.lsn for entry in self.records]
        if any(b <= a for a, b in zip(lsns, lsns[1:], strict=False)):
            raise ValueError("record lsns must be strictly increasing")
        return self

    @property
    def first_lsn(self) -> int:
        return self.records[0].lsn

    @property
    def last_lsn(self) -> int:
        return self.records[-1].lsn

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.gateway, self.log_id, self.first_lsn, self.last_lsn)


class BatchAck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    v: Literal[1] = 1
    stored: int
    duplicates: int
    first_lsn: int
    last_lsn: int


def idempotency_key(gateway: str, log_id: str, first_lsn: int, last_lsn: int) -> str:
    return f"{check_id('gateway', gateway)}:{log_id}:{first_lsn}-{last_lsn}"


def encode_batch(gateway: str, log_id: str, entries: Iterable[tuple[int, bytes]]) -> bytes:
    """Build a batch body from (lsn, encoded record) pairs without decoding the records."""
    head = f'{{"v":1,"gateway":"{check_id("gateway", gateway)}","log_id":"{log_id}","records":['.encode()
    body = b",".join(b'{"lsn":%d,"data":%s}' % (lsn, data) for lsn, data in entries)
    return head + body + b"]}"


def decode_batch(body: bytes) -> UploadBatch:
    if len(body) > MAX_BATCH_BYTES:
        raise ProtocolError("too_large", f"batch of {len(body)} bytes > limit {MAX_BATCH_BYTES}")
    try:
        return UploadBatch.model_validate_json(body)
    except ValidationError as exc:
        if any(err["type"] == "json_invalid" for err in exc.errors()):
            raise ProtocolError("not_json", "batch body is not valid JSON (truncated upload?)") from None
        raise ProtocolError("invalid", describe_validation_error(exc)) from None
