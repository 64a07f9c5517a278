"""The spool file format and segment ownership."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from monitor.ingest.spool import Spool, decode_line, encode_line
from tests.records import api_record, stream


def test_lines_round_trip_and_detect_damage() -> None:
    records = [api_record("a"), *stream(3)]
    line = encode_line("b1", records)
    batch = decode_line(line)
    assert batch is not None and batch.batch_id == "b1" and batch.records == records
    assert decode_line(line[:-1]) is None  # torn: no newline
    assert decode_line(line[:-20] + b"\n") is None  # torn: checksum
    assert decode_line(line.replace(b'"a"', b'"b"')) is None  # corrupt


def test_append_seal_read_discard(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append("b1", [api_record("a")])
    spool.append("b2", [api_record("b"), api_record("c")])
    (segment,) = spool.seal()
    spool.append("b3", [api_record("d")])  # goes to a new segment
    assert [b.batch_id for b in spool.read(segment)] == ["b1", "b2"]
    spool.discard(segment)
    assert not segment.path.exists()
    assert [[b.batch_id for b in spool.read(s)] for s in spool.seal()] == [["b3"]]
    spool.close()


def test_segments_are_claimed_only_when_their_owner_is_gone(tmp_path: Path) -> None:
    owner = Spool(tmp_path)
    owner.append("b1", [api_record("a")])
    other = Spool(tmp_path)
    assert other.claim_orphans() == 0  # the owner holds the lock
    owner.close()  # as if the owner died: its lock is released, the file stays
    assert other.claim_orphans() == 1
    (segment,) = other.seal()
    assert [b.batch_id for b in other.read(segment)] == ["b1"]
    other.close()


def test_a_torn_tail_is_skipped_and_a_corrupt_line_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = Spool(tmp_path)
    spool.append("b1", [api_record("a")])
    spool.append("b2", [api_record("b")])
    spool.close()
    (path,) = tmp_path.glob("spool-*.jsonl")
    data = path.read_bytes()
    path.write_bytes(data + encode_line("b3", [api_record("c")])[:30])  # died mid-write
    reader = Spool(tmp_path)
    reader.claim_orphans()
    (segment,) = reader.seal()
    with caplog.at_level(logging.WARNING):
        assert [b.batch_id for b in reader.read(segment)] == ["b1", "b2"]
    assert "torn write" in caplog.text
    reader.discard(segment)
    assert not list(tmp_path.glob("spool-*"))

    lines = data.splitlines(keepends=True)
    path.write_bytes(lines[0].replace(b"chat", b"chit") + lines[1])
    reader.claim_orphans()
    (segment,) = reader.seal()
    assert [b.batch_id for b in reader.read(segment)] == ["b2"]
    reader.discard(segment)
    assert list(tmp_path.glob("*.corrupt"))  # kept for an operator, never silently dropped
    reader.close()
