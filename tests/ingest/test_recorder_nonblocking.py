"""The recorder never holds its caller on a hung database (issue 32).

A database that hangs is simulated by a statement hook that waits on an event, and a stalled
spool disk by wrapping ``Spool.append`` the same way: if a call under test waited on either, the
test would find its caller thread still blocked (a deadlock check with a generous bound, not a
speed assertion). The hook is in this process's engine, so these recorders commit in this process
(``writer_process`` off); tests/ingest/test_writer_process.py hangs a real database under a writer process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.engine import Engine

from decoder.record import RequestRecord
from monitor.ingest.recorder import Recorder
from monitor.ingest.settings import RecorderSettings
from monitor.ingest.spool import Spool
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.models import RequestRow
from tests.records import stream

DEADLOCK_S = 20.0  # far beyond any call that does not wait on the hang


class Gate:
    """Holds whoever passes it while closed; ``entered`` tells that someone is held."""

    def __init__(self) -> None:
        self.closed = False
        self.entered = threading.Event()
        self._open = threading.Event()

    def close(self) -> None:
        self.closed = True
        self._open.clear()

    def open(self) -> None:
        self.closed = False
        self._open.set()

    def pass_through(self) -> None:
        if self.closed:
            self.entered.set()
            assert self._open.wait(60), "gate never opened"


@pytest.fixture
def hung_engine(tmp_path: Path) -> Iterator[tuple[Engine, Gate]]:
    engine = create_engine(f"sqlite:///{tmp_path / 'dw.db'}")
    upgrade(engine)
    gate = Gate()

    def before(*_: Any) -> None:
        gate.pass_through()

    event.listen(engine, "before_cursor_execute", before)
    try:
        yield engine, gate
    finally:
        gate.open()
        engine.dispose()


def stored(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(RequestRow)).scalar_one())


def in_thread(call: Any) -> threading.Thread:
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def test_record_nowait_returns_with_the_queue_full_the_writer_hung_and_the_spool_stalled(
    hung_engine: tuple[Engine, Gate], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, database = hung_engine
    disk = Gate()
    append = Spool.append
    spooled_on: set[str] = set()

    def stalled_append(self: Spool, batch_id: str, records: Any) -> None:
        spooled_on.add(threading.current_thread().name)
        disk.pass_through()
        append(self, batch_id, records)

    monkeypatch.setattr(Spool, "append", stalled_append)
    settings = in_process(tmp_path, queue_size=10, write_timeout_s=60)
    records = stream(101)
    accepted: list[bool] = []
    with Recorder(engine, settings) as recorder:
        database.close()
        disk.close()
        recorder.record_nowait(records[0])
        assert database.entered.wait(DEADLOCK_S)  # the writer is inside a write that does not return
        caller = in_thread(lambda: accepted.extend(recorder.record_nowait(rec) for rec in records[1:]))
        caller.join(DEADLOCK_S)
        assert not caller.is_alive(), "record_nowait waited on the hung database or the stalled spool"
        # The queue took queue_size, the hand-off as many more (and what the spill thread holds); the rest
        # is dropped and counted, never waited for.
        assert 20 <= accepted.count(True) <= 30 and recorder.stats().dropped == accepted.count(False)
        assert "MainThread" not in spooled_on and spooled_on <= {"draftwatch-recorder-spill"}
        database.open()
        disk.open()
        assert recorder.flush(DEADLOCK_S)
        assert recorder.wait_replayed(DEADLOCK_S)
    assert stored(engine) == 1 + accepted.count(True)


def in_process(tmp_path: Path, *, queue_size: int, write_timeout_s: float) -> RecorderSettings:
    """Batches of 5 flushed at once, committed in this process, where the hook that hangs the database is."""
    return RecorderSettings(spool_dir=tmp_path / "spool", queue_size=queue_size, batch_size=5, flush_interval_s=0.01,
                            write_timeout_s=write_timeout_s, writer_process=False)  # fmt: skip


def timed_out_settings(tmp_path: Path) -> RecorderSettings:
    """Small batches, and a write counted as hung after 0.2 s."""
    return in_process(tmp_path, queue_size=20, write_timeout_s=0.2)


def hang_the_first_write(recorder: Recorder, database: Gate, first: RequestRecord) -> float:
    """Freeze the database under the first write and wait until the recorder counts it hung; returns a deadline."""
    database.close()
    recorder.record(first)
    assert database.entered.wait(DEADLOCK_S)
    deadline = time.monotonic() + DEADLOCK_S
    while not recorder.stats().database_hung:
        assert time.monotonic() < deadline, "the hung write was never noticed"
        time.sleep(0.01)
    return deadline


def test_a_write_that_hangs_past_write_timeout_sends_batches_to_the_spool_until_it_returns(
    hung_engine: tuple[Engine, Gate], tmp_path: Path
) -> None:
    engine, database = hung_engine
    settings = timed_out_settings(tmp_path)
    records = stream(200)
    with Recorder(engine, settings) as recorder:
        deadline = hang_the_first_write(recorder, database, records[0])
        assert not recorder.stats().database_available
        # Far more than the queue holds, all taken while the first write still hangs: the writer drains
        # the queue to the spool (each record waits for room here, so none goes to the hand-off).
        for rec in records[1:]:
            while recorder.stats().queued >= settings.queue_size:
                assert time.monotonic() < deadline, "the queue was not drained while the database hung"
                time.sleep(0.001)
            assert recorder.record_nowait(rec)
        while recorder.stats().spooled < len(records) - 1 - settings.queue_size:
            assert time.monotonic() < deadline, "batches did not go to the spool while the database hung"
            time.sleep(0.01)
        assert recorder.stats().dropped == 0 and recorder.stats().written == 0
        database.open()  # the database thaws: the hung batch commits, the spool replays
        assert recorder.flush(DEADLOCK_S) and recorder.wait_replayed(DEADLOCK_S)
        stats = recorder.stats()
        assert not stats.database_hung and stats.database_available
    assert stored(engine) == len(records)
    assert stats.written + stats.replayed == len(records) and stats.duplicates == 0


def test_a_replay_that_runs_long_but_commits_is_not_taken_for_a_hung_database(
    hung_engine: tuple[Engine, Gate], tmp_path: Path
) -> None:
    engine, database = hung_engine
    settings = timed_out_settings(tmp_path)
    records = stream(100)
    with Recorder(engine, settings) as recorder:
        deadline = hang_the_first_write(recorder, database, records[0])
        for rec in records[1:]:
            recorder.record(rec)
        while recorder.stats().spooled < len(records) - 1:  # 5 to a line: a replay of about 20 groups
            assert time.monotonic() < deadline
            time.sleep(0.01)
        slow = threading.Event()
        event.listen(engine, "before_cursor_execute", lambda *_: slow.is_set() and time.sleep(0.01))
        slow.set()  # each group now takes a few statements of 10 ms: the whole replay far past 0.2 s
        database.open()
        hung_seen = []
        while recorder.stats().spool_pending or recorder.stats().database_hung:
            assert time.monotonic() < deadline + DEADLOCK_S, "the replay never finished"
            if recorder.stats().database_hung and recorder.stats().replayed:
                hung_seen.append(recorder.stats().replayed)
            time.sleep(0.01)
        slow.clear()
        assert recorder.stats().replayed == len(records) - 1
    assert hung_seen == [], "a replay that kept committing was taken for a hung database"
    assert stored(engine) == len(records)


def test_the_spill_thread_spools_all_it_was_handed_in_one_line(
    hung_engine: tuple[Engine, Gate], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one fsync is slow the hand-off fills; the next line takes all of it, not a batch_size of it.

    Taken a batch at a time, a hand-off of 10 behind a slow disk needed 2 more fsyncs at batch size 5
    (under load, each one more chance for the bounded hand-off to overflow and drop a record).
    """
    engine, database = hung_engine
    disk = Gate()
    append = Spool.append
    lines: list[int] = []

    def slow_append(self: Spool, batch_id: str, records: Any) -> None:
        lines.append(len(records))
        disk.pass_through()
        append(self, batch_id, records)

    monkeypatch.setattr(Spool, "append", slow_append)
    settings = in_process(tmp_path, queue_size=10, write_timeout_s=60)
    records = stream(22)
    with Recorder(engine, settings) as recorder:
        database.close()
        disk.close()
        recorder.record_nowait(records[0])
        assert database.entered.wait(DEADLOCK_S)  # the writer holds its batch inside a write that does not return
        for rec in records[1:11]:
            assert recorder.record_nowait(rec)  # the queue
        assert recorder.record_nowait(records[11])  # handed off: the spill thread takes it and stalls on the disk
        assert disk.entered.wait(DEADLOCK_S)
        for rec in records[12:22]:
            assert recorder.record_nowait(rec)  # the hand-off, full
        disk.open()
        database.open()
        assert recorder.flush(DEADLOCK_S) and recorder.wait_replayed(DEADLOCK_S)
        assert recorder.stats().dropped == 0
    assert lines == [1, 10]
    assert stored(engine) == 22
