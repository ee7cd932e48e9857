"""cloud/store/blobs.py on real files: append only at the stored offset, commit verifies the hash and is
atomic, a committed blob is never changed (replays are no-ops), partial uploads survive a reopen."""

from __future__ import annotations

import hashlib

from cloud.store.blobs import (
    Appended,
    BlobStore,
    Conflict,
    HashMismatch,
    OffsetMismatch,
    TooLarge,
    valid_blob_id,
)

DATA = bytes(range(256)) * 40  # 10 KiB
SHA = hashlib.sha256(DATA).hexdigest()


def test_chunks_append_at_the_offset_and_commit_atomically(tmp_path):
    store = BlobStore(tmp_path)
    first = store.append("gw1", "frame-1", 0, DATA[:4096])
    assert isinstance(first, Appended) and first.status.offset == 4096 and first.written == 4096
    mismatch = store.append("gw1", "frame-1", 0, DATA[:4096])  # a resend of the chunk it has
    assert isinstance(mismatch, OffsetMismatch) and mismatch.status.offset == 4096
    assert not store.committed_path("gw1", "frame-1").exists()
    done = store.append("gw1", "frame-1", 4096, DATA[4096:], final_sha256=SHA)
    assert isinstance(done, Appended) and done.committed_now
    assert done.status.committed and done.status.offset == len(DATA) and done.status.sha256 == SHA
    assert store.committed_path("gw1", "frame-1").read_bytes() == DATA
    assert not (tmp_path / "gw1" / ".partial" / "frame-1").exists()
    assert store.counters["bytes_written"] == len(DATA)


def test_committed_blob_is_a_noop_replay_and_refuses_another_hash(tmp_path):
    store = BlobStore(tmp_path)
    store.append("gw1", "b", 0, DATA, final_sha256=SHA)
    again = store.append("gw1", "b", 0, DATA, final_sha256=SHA)
    assert isinstance(again, Appended) and again.written == 0 and again.status.committed
    chunk_again = store.append("gw1", "b", 0, DATA[:100])
    assert isinstance(chunk_again, Appended) and chunk_again.written == 0
    other = store.append("gw1", "b", 0, b"other", final_sha256=hashlib.sha256(b"other").hexdigest())
    assert isinstance(other, Conflict)
    assert store.committed_path("gw1", "b").read_bytes() == DATA
    assert store.counters["bytes_written"] == len(DATA)


def test_hash_mismatch_discards_the_partial(tmp_path):
    store = BlobStore(tmp_path)
    store.append("gw1", "b", 0, DATA[:5000])
    bad = store.append("gw1", "b", 5000, b"x" * (len(DATA) - 5000), final_sha256=SHA)
    assert isinstance(bad, HashMismatch) and bad.expected == SHA
    status = store.status("gw1", "b")
    assert status.offset == 0 and not status.committed
    assert not store.committed_path("gw1", "b").exists()


def test_partial_upload_survives_a_reopen(tmp_path):
    BlobStore(tmp_path).append("gw1", "b", 0, DATA[:3000])
    reopened = BlobStore(tmp_path)  # a restarted cloudd
    assert reopened.status("gw1", "b").offset == 3000
    done = reopened.append("gw1", "b", 3000, DATA[3000:], final_sha256=SHA)
    assert isinstance(done, Appended) and done.status.committed


def test_empty_blob_limits_and_ids(tmp_path):
    store = BlobStore(tmp_path, max_blob_bytes=8192)
    empty = store.append("gw1", "empty", 0, b"", final_sha256=hashlib.sha256(b"").hexdigest())
    assert isinstance(empty, Appended) and empty.status.committed and empty.status.offset == 0
    assert isinstance(store.append("gw1", "big", 0, DATA), TooLarge)
    assert valid_blob_id("frame-0001.jpg") and not valid_blob_id(".partial") and not valid_blob_id("a/b")
