"""POST /v1/gateways/{gw}/batches against a real cloudd process: storing, idempotency, refusals."""

from __future__ import annotations

import json
import urllib.request

import pytest

from protocol.batch import MAX_BATCH_BYTES, idempotency_key
from tests.harness.cloud_http import batch_body, http_json_body, post, raw_http, upload
from tests.harness.cloudd import start_cloudd

LOG = "abcdef12"


def up(cloudd, lsns, gateway="gw1", log_id=LOG, **kw):
    kw.setdefault("token", cloudd.token_for(gateway))
    return upload(cloudd.url, gateway=gateway, log_id=log_id, lsns=lsns, **kw)


def stored_lsns(cloudd, gateway=None):
    return sorted(r.lsn for r in cloudd.records(gateway))


def assert_alive_and_empty(cloudd):
    with urllib.request.urlopen(f"{cloudd.url}/healthz", timeout=10) as response:
        assert json.loads(response.read())["ok"] is True
    assert cloudd.records() == []
    assert cloudd.status()["totals"] == {"records": 0, "batches": 0}


def metric(cloudd, line_prefix):
    with urllib.request.urlopen(f"{cloudd.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(line_prefix)]
    return values[0] if values else 0.0


@pytest.fixture(scope="module")
def untouched(tmp_path_factory):
    """One cloudd for the tests it refuses: nothing they send may change its state, and each checks
    that (``assert_alive_and_empty``), so a refusal that stored anything fails there. The tests that
    store, or count a rejection, have a cloudd of their own (the ``cloudd`` fixture)."""
    cloudd = start_cloudd(tmp_path_factory.mktemp("untouched"))
    yield cloudd
    cloudd.stop()


def test_batch_stored_and_counted(cloudd):
    status, ack = up(cloudd, [1, 2, 3])
    assert status == 200
    assert ack == {"v": 1, "stored": 3, "duplicates": 0, "first_lsn": 1, "last_lsn": 3}
    up(cloudd, [1, 2], gateway="gw2", device="cam1")
    assert stored_lsns(cloudd, "gw1") == [1, 2, 3]
    doc = cloudd.status()
    gateways = {g["id"]: g for g in doc["gateways"]}
    assert (gateways["gw1"]["records"], gateways["gw1"]["batches"]) == (3, 1)
    assert gateways["gw3"] == {"id": "gw3", "last_seen": None, "records": 0, "batches": 0, "duplicates": 0}
    assert {(d["gateway"], d["device"], d["records"]) for d in doc["devices"]} == {
        ("gw1", "dev1", 3),
        ("gw2", "cam1", 2),
    }
    assert doc["totals"] == {"records": 5, "batches": 2}
    assert metric(cloudd, "cloudd_records_stored_total") == 5
    assert metric(cloudd, "cloudd_batches_total") == 2


def test_replay_stored_once(cloudd):
    up(cloudd, [1, 2, 3])
    status, ack = up(cloudd, [1, 2, 3])
    assert status == 200 and (ack["stored"], ack["duplicates"]) == (0, 3)
    assert stored_lsns(cloudd) == [1, 2, 3]
    assert metric(cloudd, "cloudd_duplicate_records_total") == 3


def test_partial_overlap_and_out_of_order(cloudd):
    assert up(cloudd, [20, 21, 22])[1]["stored"] == 3  # a later range first (priority draining)
    assert up(cloudd, [1, 2, 3, 4])[1]["stored"] == 4
    status, ack = up(cloudd, [3, 4, 5, 6])
    assert (ack["stored"], ack["duplicates"]) == (2, 2)
    assert up(cloudd, list(range(5, 23)))[1] == {
        "v": 1,
        "stored": 13,
        "duplicates": 5,
        "first_lsn": 5,
        "last_lsn": 22,
    }
    assert stored_lsns(cloudd) == list(range(1, 23))


@pytest.mark.parametrize("token", [None, "wrong"])
def test_wrong_or_missing_token_is_401(untouched, token):
    status, body = up(untouched, [1, 2], token=token)
    assert status == 401 and body["error"] == "unauthorized" and "gw1" in body["detail"]
    assert_alive_and_empty(untouched)


def test_another_gateways_token_is_403(untouched):
    status, body = up(untouched, [1, 2], token="token-gw2")
    assert status == 403 and body["error"] == "forbidden" and "gw2" in body["detail"]
    assert_alive_and_empty(untouched)


def test_unknown_gateway_is_refused(untouched):
    status, body = upload(untouched.url, "token-gw1", "gw9", LOG, [1])  # gw1's token, not gw9's path
    assert status == 403 and body["error"] == "forbidden"
    status, body = upload(untouched.url, "no-such-token", "gw9", LOG, [1])
    assert status == 401 and body["error"] == "unauthorized"


def bad_post(cloudd, body: bytes, key: str = "gw1:abcdef12:1-1"):
    return post(
        f"{cloudd.url}/v1/gateways/gw1/batches",
        body,
        {"Authorization": f"Bearer {cloudd.token_for('gw1')}", "Idempotency-Key": key},
    )


@pytest.mark.parametrize(
    "body, error, names",
    [
        (b'{"v":1,"gateway":"gw1","log_id":"abcdef12","records":[{"lsn":1,', "not_json", "JSON"),
        (b"", "not_json", "JSON"),
        (
            b'{"v":1,"gateway":"gw1","log_id":"abcdef12","records":[{"lsn":"one","data":{}}]}',
            "invalid",
            "records.0.lsn",
        ),
        (b'{"v":2,"gateway":"gw1","log_id":"abcdef12","records":[]}', "invalid", "v"),
        (b'{"v":1,"gateway":"gw1","log_id":"abcdef12","records":[]}', "invalid", "records"),
    ],
)
def test_malformed_bodies_are_400_naming_the_problem(untouched, body, error, names):
    status, answer = bad_post(untouched, body)
    assert status == 400 and answer["error"] == error and names in answer["detail"]
    assert_alive_and_empty(untouched)


def test_lsns_not_increasing_is_400(untouched):
    body = batch_body("gw1", LOG, [3, 2])
    status, answer = bad_post(untouched, body, key="gw1:abcdef12:3-2")
    assert status == 400 and answer["error"] == "invalid" and "increasing" in answer["detail"]


def test_mismatched_gateway_is_400(untouched):
    status, body = up(untouched, [1], gateway="gw2", token=untouched.token_for("gw1"), path_gateway="gw1")
    assert status == 400 and body["error"] == "gateway_mismatch" and "gw2" in body["detail"]
    assert_alive_and_empty(untouched)


def test_idempotency_key_must_match(untouched):
    status, body = up(untouched, [1, 2], key=idempotency_key("gw1", LOG, 1, 3))
    assert status == 400 and body["error"] == "idempotency_key_mismatch"
    status, body = bad_post(untouched, batch_body("gw1", LOG, [1]), key="")
    assert status == 400 and body["error"] == "idempotency_key_mismatch"
    status, body = post(
        f"{untouched.url}/v1/gateways/gw1/batches",
        batch_body("gw1", LOG, [1]),
        {"Authorization": f"Bearer {untouched.token_for('gw1')}"},
    )
    assert status == 400 and body["error"] == "missing_idempotency_key"
    assert "Idempotency-Key" in body["detail"]
    assert_alive_and_empty(untouched)


def _head(cloudd, extra: str) -> bytes:
    return (
        f"POST /v1/gateways/gw1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {cloudd.token_for('gw1')}\r\nIdempotency-Key: gw1:{LOG}:1-2\r\n"
        f"{extra}\r\n"
    ).encode()


def test_oversize_declared_body_is_413_before_reading(untouched):
    response = raw_http(
        untouched.port, _head(untouched, f"Content-Length: {MAX_BATCH_BYTES + 1}\r\n") + b'{"v":1'
    )
    status, body = http_json_body(response)
    assert status == 413 and body["error"] == "too_large" and "Content-Length" in body["detail"]
    assert_alive_and_empty(untouched)


def test_oversize_chunked_body_is_413(untouched):
    chunk = b"x" * (1 << 20)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(MAX_BATCH_BYTES // len(chunk) + 1))
    response = raw_http(
        untouched.port, _head(untouched, "Transfer-Encoding: chunked\r\n") + chunks + b"0\r\n\r\n"
    )
    status, body = http_json_body(response)
    assert status == 413 and body["error"] == "too_large"
    assert_alive_and_empty(untouched)


def test_truncated_upload_stores_nothing(cloudd):
    body = batch_body("gw1", LOG, [1, 2])
    # Content-Length promises more than comes, then the connection is cut (a gateway losing its link).
    raw_http(cloudd.port, _head(cloudd, f"Content-Length: {len(body) + 100}\r\n") + body, half_close=True)
    assert_alive_and_empty(cloudd)
    assert metric(cloudd, 'cloudd_rejections_total{reason="truncated"}') == 1
    # A body cut short but with a matching Content-Length is bad JSON, answered as such.
    status, answer = bad_post(cloudd, body[: len(body) // 2])
    assert status == 400 and answer["error"] == "not_json"
    assert up(cloudd, [1, 2])[0] == 200  # and the server still stores the retry


def test_errors_are_json_everywhere(untouched):
    def get(path: str) -> tuple[int, dict]:
        request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        return http_json_body(raw_http(untouched.port, request))

    status, body = get("/v1/nope")
    assert status == 404 and body["error"] == "not_found"
    status, body = get("/v1/gateways/gw1/batches")
    assert status == 405 and body["error"] == "method_not_allowed"


def test_status_requires_operator_token(untouched):
    for headers in ({}, {"Authorization": "Bearer nope"}):
        request = urllib.request.Request(f"{untouched.url}/v1/status", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        assert info.value.code == 401 and json.loads(info.value.read())["error"] == "unauthorized"
    assert untouched.status()["v"] == 1
