"""The recorder's writer process (issue 49): batches are committed by a child, and a child that dies, is
signalled or hangs on the database loses and doubles nothing."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import event, select, text
from sqlalchemy.pool import StaticPool

from decoder.record import RequestRecord
from monitor.ingest.recorder import Recorder
from monitor.ingest.settings import RecorderSettings
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.models import RecorderBatchRow
from tests.ingest.test_recorder_durable import stored_ids
from tests.records import stream

WAIT_S = 30.0  # far beyond any write that does not wait on a lock


def writer_children() -> list[int]:
    """This process's children that run the writer process's module."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        if ppid == os.getpid() and b"monitor.ingest.writer_process" in command:
            found.append(int(entry.name))
    return found


def test_the_child_commits_the_batches_and_the_hook_sees_only_new_records(db_url: str, tmp_path: Path) -> None:
    engine = create_engine(db_url)
    upgrade(engine)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, statement, *_: statements.append(statement))
    durable: list[tuple[str, list[str]]] = []

    def hook(records: Sequence[RequestRecord], where: str) -> None:
        durable.append((where, [rec.request_id for rec in records]))

    first, second = stream(2)
    settings = RecorderSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.01)
    with Recorder(engine, settings, on_durable=hook) as recorder:
        recorder.record(first)
        assert recorder.flush(WAIT_S)
        (child,) = writer_children()
        recorder.record(second)
        recorder.record(first)  # a re-sent record: stored once, and not handed to the hook again
        assert recorder.flush(WAIT_S)
        stats = recorder.stats()
    assert (stats.written, stats.duplicates) == (2, 1)
    assert sorted(rid for _, ids in durable for rid in ids) == sorted([first.request_id, second.request_id])
    assert {where for where, _ in durable} == {"written"}
    assert not [s for s in statements if "INSERT" in s.upper()], "the sidecar's own engine wrote a batch"
    assert sorted(stored_ids(db_url)) == sorted([first.request_id, second.request_id])
    with engine.connect() as conn:
        # The batch marker names the recording process, not its writer.
        assert set(conn.execute(select(RecorderBatchRow.pid)).scalars()) == {os.getpid()}
    assert child not in writer_children()  # the recorder's close ended it
    engine.dispose()


def test_a_killed_child_loses_nothing_and_a_signalled_one_goes_on(db_url: str, tmp_path: Path) -> None:
    engine = create_engine(db_url)
    upgrade(engine)
    records = stream(30)
    settings = RecorderSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.01, retry_interval_s=0.1)
    with Recorder(engine, settings) as recorder:
        for rec in records[:10]:
            recorder.record(rec)
        assert recorder.flush(WAIT_S)
        (child,) = writer_children()
        # SIGTERM and SIGINT are the whole process group's at a shutdown: the sidecar ends its writer itself.
        os.kill(child, signal.SIGTERM)
        os.kill(child, signal.SIGINT)
        for rec in records[10:20]:
            recorder.record(rec)
        assert recorder.flush(WAIT_S)
        assert writer_children() == [child]
        os.kill(child, signal.SIGKILL)
        for rec in records[20:29]:
            recorder.record(rec)
        assert recorder.flush(WAIT_S) and recorder.wait_replayed(WAIT_S)
        recorder.record(records[29])  # the next batch starts a new child
        assert recorder.flush(WAIT_S)
        assert [pid for pid in writer_children() if pid != child], "no new writer process after the kill"
    assert sorted(stored_ids(db_url)) == sorted(r.request_id for r in records)
    engine.dispose()


def test_a_database_that_hangs_under_the_child_spools_until_it_answers(pg_url: str, tmp_path: Path) -> None:
    """A real hang: another session holds the batch table's lock, so the child's INSERT waits on it."""
    engine = create_engine(pg_url)
    upgrade(engine)
    first, *rest = stream(11)
    settings = RecorderSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.01, write_timeout_s=0.5)
    holder = engine.connect()
    try:
        with Recorder(engine, settings) as recorder:
            recorder.record(first)
            assert recorder.flush(WAIT_S)
            transaction = holder.begin()
            holder.execute(text("LOCK TABLE recorder_batches IN ACCESS EXCLUSIVE MODE"))
            recorder.record(rest[0])
            deadline = time.monotonic() + WAIT_S
            while not recorder.stats().database_hung:
                assert time.monotonic() < deadline, "the hung write was never noticed"
                time.sleep(0.01)
            for rec in rest[1:]:
                recorder.record(rec)
            while recorder.stats().spooled < len(rest) - 1:  # the later batches, while the first hangs
                assert time.monotonic() < deadline, "batches did not go to the spool while the database hung"
                time.sleep(0.01)
            assert recorder.stats().written == 1
            transaction.rollback()
            deadline = time.monotonic() + WAIT_S
            while recorder.stats().database_hung:
                assert time.monotonic() < deadline, "the hung write never returned"
                time.sleep(0.01)
            assert recorder.flush(WAIT_S) and recorder.wait_replayed(WAIT_S)
    finally:
        holder.close()
    assert sorted(stored_ids(pg_url)) == sorted(r.request_id for r in (first, *rest))
    engine.dispose()


def test_an_in_memory_database_is_written_in_this_process(tmp_path: Path) -> None:
    engine = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    upgrade(engine)
    with Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.01)) as recorder:
        recorder.record(stream(1)[0])
        assert recorder.flush(WAIT_S)
        assert writer_children() == []  # a child could not see this database
        assert recorder.stats().written == 1
    engine.dispose()


def test_a_batch_of_many_slices_arrives_whole_and_the_hook_sees_each_record_once(db_url: str, tmp_path: Path) -> None:
    """A batch goes to the child, and to the counters, in slices of 32 records: 100 records, in few batches."""
    engine = create_engine(db_url)
    upgrade(engine)
    seen: list[str] = []
    records = stream(100)
    settings = RecorderSettings(spool_dir=tmp_path / "spool", flush_interval_s=0.5)
    with Recorder(engine, settings, on_durable=lambda batch, _: seen.extend(r.request_id for r in batch)) as recorder:
        for rec in records:
            recorder.record(rec)
        assert recorder.flush(WAIT_S)
    with engine.connect() as conn:
        batches = list(conn.execute(select(RecorderBatchRow.n_records)).scalars())
    assert max(batches) > 32, batches  # the premise: a batch of more than one slice
    assert sorted(seen) == sorted(stored_ids(db_url)) == sorted(r.request_id for r in records)
    engine.dispose()
