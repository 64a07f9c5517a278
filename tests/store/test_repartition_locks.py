"""`draftwatch db partition` holds writers only for its triggers, not while it makes the new table's partitions.

Preparing a conversion creates triggers on the live table: from the first to the commit every writer
of the table waits. The new table's partitions (a CREATE TABLE, an ATTACH and index renames each) are
made before them, so a writer inserting batches through the store's writer path during the
preparation never waits past 0.2 s, however many partitions ahead it makes (made after the
triggers, a month of them held writers for the whole of it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.engine import Engine

from monitor.ingest.synthetic import synthetic_record
from monitor.store import migrate
from monitor.store.engine import create_engine
from monitor.store.partitions import is_partitioned, list_partitions
from monitor.store.repartition import conversion_in_progress, convert
from monitor.store.writes.writer import write_batch
from tests.store.legacy import write_at_old_revision

NOW = datetime.now(UTC).replace(microsecond=0)
STALL_S = 0.2  # the longest a writer's batch may take (the recorder flushes every 0.2 s by default)
AHEAD_DAYS = 60  # partitions the preparation makes: enough that making them after the triggers shows


@pytest.fixture
def legacy(pg_url: str) -> Iterator[Engine]:
    """A database at head whose requests stayed unpartitioned: 300 requests when migration 0014 ran."""
    engine = create_engine(pg_url)
    migrate.upgrade(engine, "0013")
    old = [synthetic_record(i, start=NOW - timedelta(days=2), spacing=timedelta(minutes=5), prefix="old")
           for i in range(300)]  # fmt: skip
    with engine.begin() as conn:
        write_at_old_revision(conn, old, "old")
    migrate.upgrade(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def test_preparing_a_conversion_holds_no_writer_while_it_makes_the_new_partitions(legacy: Engine) -> None:
    spans: list[tuple[float, float]] = []  # each batch's start and end
    stop = threading.Event()

    def ingest() -> None:
        batch = 0
        while not stop.is_set():
            records = [synthetic_record(batch * 20 + i, start=NOW, prefix="w") for i in range(20)]
            t0 = time.perf_counter()
            with legacy.begin() as conn:
                write_batch(conn, records, f"w{batch}", "live")
            spans.append((t0, time.perf_counter()))
            batch += 1
            time.sleep(0.005)

    writer = threading.Thread(target=ingest)
    writer.start()
    try:
        time.sleep(0.2)
        t0 = time.perf_counter()
        outcome = convert(legacy, partitioned=True, ahead_days=AHEAD_DAYS, max_batches=1, tables=("requests",))
        t1 = time.perf_counter()
    finally:
        stop.set()
        writer.join()
    assert outcome.state == "paused"  # prepared, one batch copied
    with legacy.connect() as conn:
        assert conversion_in_progress(conn) and not is_partitioned(conn)
        assert len(list_partitions(conn, "requests_next")) >= AHEAD_DAYS  # its days ahead and its default
    # The batches that ran while it prepared; those before it (the writer's first, its statements not yet
    # compiled) are not its doing.
    during = [end - start for start, end in spans if end > t0 and start < t1]
    assert during, "no batch ran during the preparation"
    assert max(during) < STALL_S, f"a writer's batch waited {max(during):.3f} s of the {t1 - t0:.3f} s prepare"
