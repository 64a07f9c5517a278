"""Recorder behaviour on both dialects: batching, full-queue policies, database away at start."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from decoder.record import RequestRecord
from monitor.config import Settings
from monitor.ingest.recorder import Recorder, RecorderClosedError, RecorderFullError
from monitor.ingest.settings import RecorderSettings
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.models import RequestRow, RollupMinuteRow
from tests.faults import refuse_value
from tests.pg import PG_URL, drop_pg_database
from tests.records import api_record, stream


def stored_count(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        requests = conn.execute(select(func.count()).select_from(RequestRow)).scalar_one()
        rolled = conn.execute(select(func.coalesce(func.sum(RollupMinuteRow.n_requests), 0))).scalar_one()
    return int(requests), int(rolled)


def test_records_arrive_in_batches_and_hooks_see_them(engine: Engine, tmp_path: Path) -> None:
    seen: list[tuple[int, str]] = []
    recorder = Recorder(
        engine,
        RecorderSettings(spool_dir=tmp_path / "spool", batch_size=100),
        on_durable=lambda b, w: seen.append((len(b), w)),
    )
    with recorder:
        for rec in stream(1000):
            recorder.record(rec)
        assert recorder.flush(20)
        assert recorder.stats().queued == 0
    assert stored_count(engine) == (1000, 1000)
    assert sum(n for n, _ in seen) == 1000 and {w for _, w in seen} == {"written"}
    assert max(n for n, _ in seen) <= 100
    with Recorder(
        engine, RecorderSettings(spool_dir=tmp_path / "spool"), on_durable=lambda b, w: seen.append((len(b), w))
    ) as again:
        for rec in stream(10):  # already stored: durable, but nothing new for the hook
            again.record(rec)
        assert again.flush(20)
        assert again.stats().duplicates == 10
    assert sum(n for n, _ in seen) == 1000
    with pytest.raises(RecorderClosedError):
        recorder.record(stream(1)[0])


def test_flush_waits_for_an_announced_record(engine: Engine, tmp_path: Path) -> None:
    """The proxy makes an answer's record after the answer went (monitor/proxy/forward/exchange.py): a flush
    between the two waits for it, so that whoever flushes after an answer finds its record stored."""
    with Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool")) as recorder:
        recorder.expect()
        assert not recorder.flush(0.2)
        later = threading.Timer(0.3, lambda: (recorder.record_nowait(stream(1)[0]), recorder.arrived()))
        later.start()
        assert recorder.flush(20)
        assert stored_count(engine) == (1, 1)
        recorder.expect()
        recorder.arrived()  # announced, then refused: nothing to wait for
        assert recorder.flush(0.2)


def test_the_recorder_runs_on_its_settings_section(engine: Engine, tmp_path: Path) -> None:
    settings = Settings.from_env(
        {"HOME": str(tmp_path), "DRAFTWATCH_RECORDER_BATCH_SIZE": "7", "DRAFTWATCH_RECORDER_QUEUE_SIZE": "9"}, None
    )
    with Recorder(engine, settings.recorder) as recorder:
        assert recorder._maxsize == 9 and recorder.settings.batch_size == 7
        for rec in stream(20):
            recorder.record(rec)
    assert stored_count(engine) == (20, 20)


def test_a_refused_record_leaves_no_field_values_in_the_log(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # PostgreSQL quotes the failing row in its DETAIL and SQLAlchemy appends the statement's parameters.
    refuse_value(engine, "requests", "drafter", "drafter-value-7f3")
    secrets = {"request_id": "id-value-7f3", "prompt_hash": "hash-value-7f3", "target_model": "model-value-7f3"}
    refused = api_record(drafter="drafter-value-7f3", **secrets)
    with (
        caplog.at_level(logging.DEBUG),
        Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool", batch_size=10)) as recorder,
    ):
        for rec in [*stream(3), refused]:
            recorder.record(rec)
        assert recorder.flush(20)
        assert (recorder.stats().written, recorder.stats().failed) == (3, 1)
    assert "refused a batch" in caplog.text and "refused a record" in caplog.text
    assert "value-7f3" not in caplog.text
    rejected = list((tmp_path / "spool").glob("rejected-*.jsonl"))
    assert len(rejected) == 1 and str(rejected[0]) in caplog.text  # where the operator finds the record


class _Stalled:
    """Holds the writer thread inside the durable hook, so the queue fills up deterministically."""

    def __init__(self) -> None:
        self.release = False

    def __call__(self, batch: object, where: str) -> None:
        while where == "written" and not self.release:
            time.sleep(0.005)


@pytest.mark.parametrize("policy", ["raise", "spool", "block_then_spool"])
def test_full_queue_policies(engine: Engine, tmp_path: Path, policy: str) -> None:
    stall = _Stalled()
    recorder = Recorder(
        engine,
        RecorderSettings(
            spool_dir=tmp_path / "spool", queue_size=5, batch_size=1, full_queue_policy=policy, block_timeout_s=0.01
        ),
        on_durable=stall,
    ).start()
    records = stream(20)
    outcomes = []
    for rec in records:
        try:
            recorder.record(rec)
            outcomes.append("ok")
        except RecorderFullError:
            outcomes.append("full")
    stats = recorder.stats()
    stall.release = True
    recorder.close()
    final = recorder.stats()
    if policy == "raise":
        assert "full" in outcomes
        assert stored_count(engine)[0] == outcomes.count("ok")
    else:
        assert outcomes == ["ok"] * 20
        assert stats.spooled > 0  # the overflow went to the spool, on the caller's thread
        assert stored_count(engine) == (20, 20)  # and was replayed at close
        assert final.written + final.replayed == 20
    assert not list((tmp_path / "spool").glob("spool-*"))


def test_the_queue_bound_is_exact_with_many_callers(engine: Engine, tmp_path: Path) -> None:
    # No writer started: whatever record() takes stays queued, so exactly queue_size calls succeed.
    recorder = Recorder(
        engine, RecorderSettings(spool_dir=tmp_path / "spool", queue_size=50, full_queue_policy="raise")
    )
    records = stream(400)
    outcomes: list[str] = []

    def caller(part: list[RequestRecord]) -> None:
        for rec in part:
            try:
                recorder.record(rec)
                outcomes.append("ok")
            except RecorderFullError:
                outcomes.append("full")

    threads = [threading.Thread(target=caller, args=(records[n::8],)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("ok") == 50 and recorder.stats().queued == 50
    assert not recorder.flush(0.05)  # queued, and nothing writes them
    recorder.start()
    assert recorder.flush(20)
    recorder.close()
    assert stored_count(engine) == (50, 50)


def test_the_writer_wakes_for_a_first_record_a_full_batch_and_close(engine: Engine, tmp_path: Path) -> None:
    # record() wakes the writer only when it must; each case here finishes in time only if it does.
    spool = tmp_path / "spool"
    # An idle writer, woken by a first record: the batch is written one interval later, not two.
    with Recorder(engine, RecorderSettings(spool_dir=spool, flush_interval_s=2.0)) as recorder:
        time.sleep(0.2)  # the writer waits for a first record
        started = time.monotonic()
        recorder.record(stream(1, prefix="first")[0])
        assert recorder.flush(3.5), "an idle writer slept through the first record"
        assert time.monotonic() - started >= 1.9  # and the young batch did wait for company
    # A writer that waits for company, woken when its batch is full, long before the interval.
    with Recorder(engine, RecorderSettings(spool_dir=spool, batch_size=10, flush_interval_s=60.0)) as recorder:
        records = stream(10, prefix="full")
        recorder.record(records[0])
        time.sleep(0.2)  # the writer holds a young batch and waits
        for rec in records[1:]:
            recorder.record(rec)
        assert recorder.flush(20), "a full batch waited for the interval"
    # close() wakes a writer that waits for company, and it drains what is queued.
    recorder = Recorder(engine, RecorderSettings(spool_dir=spool, flush_interval_s=60.0)).start()
    for rec in stream(3, prefix="young"):
        recorder.record(rec)
    time.sleep(0.2)
    started = time.monotonic()
    recorder.close()
    assert time.monotonic() - started < 20
    assert stored_count(engine) == (14, 14)


def _unmigrated_or_missing(db_url: str) -> tuple[str, object]:
    """A database the recorder cannot write to yet: SQLite without schema, PostgreSQL not created."""
    if db_url.startswith("sqlite"):
        return db_url, None
    name = db_url.rsplit("/", 1)[1] + "_late"
    return PG_URL.format(name=name), name


def test_database_down_at_start_spools_then_replays(db_url: str, tmp_path: Path) -> None:
    url, late_name = _unmigrated_or_missing(db_url)
    engine = create_engine(url)
    records = stream(300)
    recorder = Recorder(
        engine, RecorderSettings(spool_dir=tmp_path / "spool", batch_size=50, retry_interval_s=0.1)
    ).start()
    try:
        for rec in records:
            recorder.record(rec)
        assert recorder.flush(20)
        stats = recorder.stats()
        assert stats.spooled == 300 and stats.written == 0 and not stats.database_available
        # The database comes up.
        if late_name is not None:
            create_pg_database_named(str(late_name))
        upgrade(engine)
        assert recorder.wait_replayed(20)
        for rec in stream(10, prefix="after"):
            recorder.record(rec)
    finally:
        recorder.close()
    stats = recorder.stats()
    assert stats.replayed == 300 and stats.written == 10 and stats.duplicates == 0
    assert stored_count(engine) == (310, 310)
    engine.dispose()
    if late_name is not None:
        drop_pg_database(str(late_name))


def create_pg_database_named(name: str) -> None:
    import psycopg

    from tests.pg import PG_ADMIN

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def test_a_restarted_recorder_replays_what_an_earlier_one_left(engine: Engine, tmp_path: Path) -> None:
    first = Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool"))
    records: list[RequestRecord] = stream(40)
    first._spool.append("left-behind", records)  # what a crashed process leaves: an unlocked segment
    first._spool.close()
    with Recorder(engine, RecorderSettings(spool_dir=tmp_path / "spool")) as second:
        assert second.wait_replayed(10)
        assert second.stats().replayed == 40
    with Recorder(
        engine, RecorderSettings(spool_dir=tmp_path / "spool")
    ) as third:  # replaying the same batch again is a no-op
        third._spool.append("left-behind", records)
        third._spool.seal()
        assert third.wait_replayed(10)
        assert third.stats().replayed == 0 and third.stats().duplicates == 0
    assert stored_count(engine) == (40, 40)
