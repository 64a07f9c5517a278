"""``Recorder.record_durable``: the record is fsync'd to the spool when its future says so, then stored once.

The proxy's ``recorder.spool_before_reply`` stands on it (tests/proxy/test_crash.py kills a real
sidecar); these tests hold the spool's disk (``Spool.append`` wrapped by a gate, as in
tests/ingest/test_recorder_nonblocking.py) to make the in-between states deterministic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from monitor.ingest.recorder import Recorder
from monitor.ingest.settings import RecorderSettings
from monitor.ingest.spool import Spool, decode_line
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.models import RequestRow
from tests.ingest.test_recorder_nonblocking import DEADLOCK_S, Gate
from tests.records import stream


def stored_ids(db: str) -> list[str]:
    engine = create_engine(db)
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(RequestRow.request_id)).scalars())
    finally:
        engine.dispose()


def spooled_ids(directory: Path) -> list[str]:
    """The request ids in the spool's segments on disk, as a process started after a kill -9 would read them."""
    lines = [line for path in sorted(directory.glob("spool-*.jsonl")) for line in path.read_bytes().splitlines(True)]
    return [rec.request_id for line in lines if (batch := decode_line(line)) for rec in batch.records]


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'dw.db'}"
    engine = create_engine(url)
    upgrade(engine)
    engine.dispose()
    return url


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Gate:
    gate = Gate()
    append = Spool.append

    def gated_append(self: Spool, batch_id: str, records: Any) -> None:
        gate.pass_through()
        append(self, batch_id, records)

    monkeypatch.setattr(Spool, "append", gated_append)
    return gate


def test_the_record_is_on_disk_when_its_future_says_so_and_then_stored_once(
    db: str, tmp_path: Path, disk: Gate
) -> None:
    first, second = stream(2)
    # A flush interval longer than the test: a record the writer took from the queue could not be stored.
    settings = RecorderSettings(spool_dir=tmp_path / "spool", flush_interval_s=3600)
    recorder = Recorder(create_engine(db), settings).start()
    try:
        disk.close()
        held = recorder.record_durable(first)
        assert disk.entered.wait(DEADLOCK_S)
        waiting = recorder.record_durable(second)  # behind the held write
        assert not held.done() and not waiting.done()
        disk.open()
        assert held.result(DEADLOCK_S) is True and waiting.result(DEADLOCK_S) is True
        assert sorted(spooled_ids(tmp_path / "spool")) == sorted([first.request_id, second.request_id])
        assert recorder.stats().queued == 0  # not in memory: a kill -9 now would lose nothing
    finally:
        recorder.close()  # its last replay stores the spool, as the writer's next turn would
    assert sorted(stored_ids(db)) == sorted([first.request_id, second.request_id])
    assert spooled_ids(tmp_path / "spool") == []


def test_a_caller_that_stops_waiting_does_not_take_its_record_out(db: str, tmp_path: Path, disk: Gate) -> None:
    first, second, third = stream(3)
    settings = RecorderSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.01)
    with Recorder(create_engine(db), settings) as recorder:
        disk.close()
        recorder.record_durable(first)
        assert disk.entered.wait(DEADLOCK_S)
        abandoned = recorder.record_durable(second)
        assert abandoned.cancel()  # the client left while its record waited for the disk
        disk.open()
        # The spill thread survived the cancelled future and goes on spooling.
        assert recorder.record_durable(third).result(DEADLOCK_S) is True
        assert recorder.flush(DEADLOCK_S) and recorder.wait_replayed(DEADLOCK_S)
    assert sorted(stored_ids(db)) == sorted(r.request_id for r in (first, second, third))


def test_a_spool_that_cannot_be_written_sends_the_record_through_the_queue(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(self: Spool, batch_id: str, records: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Spool, "append", full_disk)
    (rec,) = stream(1)
    settings = RecorderSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.01)
    with Recorder(create_engine(db), settings) as recorder:
        assert recorder.record_durable(rec).result(DEADLOCK_S) is False  # not durable: the caller is told
        assert recorder.flush(DEADLOCK_S)
        assert recorder.stats().dropped == 0
    assert stored_ids(db) == [rec.request_id]


def test_a_closed_recorder_drops_and_counts(db: str, tmp_path: Path) -> None:
    recorder = Recorder(create_engine(db), RecorderSettings(spool_dir=tmp_path / "spool")).start()
    recorder.close()
    assert recorder.record_durable(stream(1)[0]).result(0) is False
    assert recorder.stats().dropped == 1
