"""The scrub: ``verify`` reads every record the log holds and reports all the damage it finds (each
place counted once); the background scrub does the same on its own, and a request joins it."""

from __future__ import annotations

from pathlib import Path

from tests.harness.poll import eventually
from tests.storage.storagetest_damage import filled_log, first_lsn, flip_payload, segments

HEADER = 64


async def test_verify_reports_every_damage_and_nothing_on_a_clean_log(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log = await filled_log(directory, 100)
    try:
        clean = await log.verify()
        files = segments(directory)
        assert clean.damage == [] and clean.records == 100 and clean.segments == len(files) >= 4
        assert clean.bytes == sum(f.stat().st_size - HEADER for f in files)  # every byte after a header
        first = flip_payload(directory, first_lsn(files[0]) + 3)
        second = flip_payload(directory, first_lsn(files[2]) + 1)
        for _ in range(2):
            report = await log.verify()
            assert [(d.segment, d.offset) for d in report.damage] == [
                (str(first[0]), first[1]),
                (str(second[0]), second[1]),
            ]
            assert report.segments == len(files) and report.records < 100
        assert log.stats()["corruptions"] == 2
    finally:
        await log.close()


async def test_the_background_scrub_finds_damage_and_a_request_gets_the_report(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    log = await filled_log(directory, 60, scrub_interval_s=0.05, scrub_rate_Bps=1 << 20)
    try:
        await eventually(lambda: log.stats()["scrub_passes"] >= 1, 10, "a first background pass")
        assert log.scrub.last is not None and log.scrub.last.damage == []
        segment, offset = flip_payload(directory, first_lsn(segments(directory)[1]) + 2)
        await eventually(
            lambda: log.scrub.last is not None and log.scrub.last.damage, 10, "a pass that found the damage"
        )
        assert log.stats()["corruptions"] == 1 and log.stats()["scrub_last_damage"] == 1
        answer = await log.scrub.request(wait_s=10)
        assert answer["done"] and [(d["segment"], d["offset"]) for d in answer["last"]["damage"]] == [
            (str(segment), offset)
        ]
    finally:
        await log.close()
