"""``requests`` converted between its plain and its partitioned layout online (PostgreSQL).

``draftwatch db partition`` converts an installation whose ``requests`` held rows when migration
0014 ran (which converts only an empty table); ``draftwatch db unpartition`` is the way back. Both
run :func:`convert`, in three steps, each its own short transaction or series of them:

1. **Prepare** (one transaction): the new table ``requests_next`` beside ``requests``, in the other
   layout, with the same columns and id sequence, its keys and every secondary index of
   ``requests`` (named ``..._next`` until the swap); for the partitioned layout its default
   partition and the partitions from today to ``ahead_days`` ahead. Statement-level triggers on
   ``requests`` copy every row inserted (and delete every row deleted) from then on into the new
   table, through their transition tables, so rows written during the conversion are there when it
   ends. The range of ``ts_start`` to copy is read after the triggers exist: every row committed
   before them lies in it. The state (how far the copy got) is the row of ``requests_conversion``.
2. **Copy**, in batches by ``ts_start`` ranges, oldest first, each a transaction that copies one
   range (``INSERT ... SELECT ... ON CONFLICT DO NOTHING``: a row the triggers copied already is
   skipped) and moves the state's watermark past it. A range's width adapts so that a batch copies
   about ``batch_rows`` rows; ranges without rows are skipped through the ``(workload, ts_start)``
   index. Interrupted anywhere (Ctrl-C, a kill, ``max_batches``), the next run goes on from the
   watermark. The partitions a range needs are created before it is copied.
3. **Swap** (one transaction, ``ACCESS EXCLUSIVE`` on ``requests`` for a few catalog changes):
   the triggers dropped, the sequence handed to the new table, the old table dropped (or kept as
   ``requests_old`` with ``keep_old``), the new one renamed ``requests`` with its indexes' and
   keys' final names. Writers wait for it, not longer than the swap takes: no row is copied there.

While a conversion is under way the application goes on writing and reading ``requests`` as
before (its inserts cost about twice as much: each row is written twice), and retention leaves
requests alone (:func:`conversion_in_progress`). A conversion can be abandoned with :func:`abort`,
which drops what the preparation made. Rows are never updated by draftwatch, so updates are not
copied; a ``TRUNCATE`` of ``requests`` during a conversion is not either.

Converting back to the plain layout keeps one row per request id: two rows with the same id and
different starts (which the partitioned table's unique key allows) keep the one copied first.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Final

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from monitor.store.partitions import (
    CONVERSION_SUFFIX,
    DEFAULT_PARTITION,
    PARENT,
    create_missing,
    ddl_session,
    ensure_partitions,
    grid_start,
    is_partitioned,
    name_partition_indexes,
    with_ddl_retries,
)

log = logging.getLogger(__name__)

TARGET: Final = PARENT + CONVERSION_SUFFIX  # requests_next
STATE: Final = "requests_conversion"
MIRROR: Final = "requests_conversion_mirror"
OLD_SUFFIX: Final = "_old"
# "DRFTWTCC": one conversion at a time (a session-level lock, held while a run copies).
CONVERSION_LOCK_KEY: Final = 0x4452465457544343
MIN_STEP: Final = timedelta(seconds=1)
FIRST_STEP: Final = timedelta(minutes=10)
_INDEX = re.compile(r"^CREATE (UNIQUE )?INDEX (\S+) ON (ONLY )?(\S+) USING ")


class ConversionError(RuntimeError):
    """The conversion cannot run: not PostgreSQL, another one running, one in the other direction under way."""


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a conversion stands after a batch."""

    rows_copied: int
    rows_estimate: int | None  # rows of requests by the statistics (reltuples), None before any ANALYZE
    watermark: datetime
    first: datetime
    end: datetime
    elapsed_s: float
    rows_this_run: int

    @property
    def rows_per_s(self) -> float:
        return self.rows_this_run / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def fraction(self) -> float:
        """Done, by rows against the statistics when they are known, else by the time range copied."""
        if self.rows_estimate:
            return min(1.0, self.rows_copied / self.rows_estimate)
        span = (self.end - self.first).total_seconds()
        return 1.0 if span <= 0 else min(1.0, (self.watermark - self.first).total_seconds() / span)

    @property
    def eta_s(self) -> float | None:
        if self.rows_estimate and self.rows_per_s > 0:
            return max(0.0, self.rows_estimate - self.rows_copied) / self.rows_per_s
        if 0 < self.fraction < 1 and self.elapsed_s > 0:
            return self.elapsed_s * (1 - self.fraction) / self.fraction
        return None

    def line(self) -> str:
        """``copied 1,234,567 of about 9,876,543 rows (12.5 %), 45,678 rows/s, ETA 0:03:12, up to 2026-11-05 13:00``."""
        of = f" of about {self.rows_estimate:,}" if self.rows_estimate else ""
        eta = "-" if self.eta_s is None else str(timedelta(seconds=round(self.eta_s)))
        return (f"copied {self.rows_copied:,}{of} rows ({100 * self.fraction:.1f} %), {self.rows_per_s:,.0f} rows/s, "
                f"ETA {eta}, up to {self.watermark:%Y-%m-%d %H:%M:%S}")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended: ``converted``, ``paused`` (``max_batches`` reached; run again) or ``already``."""

    state: str
    rows_copied: int
    batches: int


def conversion_in_progress(conn: Connection) -> bool:
    """Whether an online conversion of ``requests`` is under way (its state table exists); False on SQLite."""
    if conn.dialect.name != "postgresql":
        return False
    return conn.execute(text("SELECT to_regclass(:t)"), {"t": STATE}).scalar() is not None


def convert(
    engine: Engine,
    *,
    partitioned: bool,
    partition_days: int = 1,
    ahead_days: int = 7,
    batch_rows: int = 50_000,
    max_batches: int | None = None,
    keep_old: bool = False,
    progress: Callable[[Progress], None] | None = None,
) -> Outcome:
    """Convert ``requests`` to the partitioned layout (``partitioned``) or back, online; see the module docstring."""
    if engine.dialect.name != "postgresql":
        raise ConversionError("only PostgreSQL partitions requests; SQLite keeps one table")
    with _conversion_lock(engine):
        with engine.connect() as conn:
            converting = conversion_in_progress(conn)
            already = is_partitioned(conn) == partitioned
            direction = _direction(conn) if converting else None
        wanted = "partition" if partitioned else "unpartition"
        if direction is not None and direction != wanted:
            raise ConversionError(f"a conversion ({direction}) is under way: finish it, or abandon it with --abort")
        if not converting:
            if already:
                return Outcome("already", 0, 0)
            with_ddl_retries(engine, "preparing the conversion", lambda c: _prepare(c, partitioned, ahead_days))
        copied, batches = _copy(engine, partitioned, partition_days, batch_rows, max_batches, progress)
        with engine.connect() as conn:
            watermark, end, *_ = _state(conn)
        if watermark < end:
            return Outcome("paused", copied, batches)
        with_ddl_retries(engine, "swapping the tables", lambda c: _swap(c, keep_old))
        log.info("requests converted (%s): %d rows copied in this run", wanted, copied)
    if partitioned:
        ensure_partitions(engine, datetime.now(UTC), ahead_days, partition_days=partition_days)
    return Outcome("converted", copied, batches)


def abort(engine: Engine) -> bool:
    """Abandon a conversion under way: its triggers, new table and state dropped; False when none was."""
    if engine.dialect.name != "postgresql":
        return False
    with _conversion_lock(engine):

        def drop(conn: Connection) -> bool:
            if not conversion_in_progress(conn):
                return False
            conn.execute(text(f"DROP FUNCTION {MIRROR}() CASCADE"))  # and the triggers calling it
            conn.execute(text(f"DROP TABLE {TARGET}"))
            conn.execute(text(f"DROP TABLE {STATE}"))
            return True

        dropped = with_ddl_retries(engine, "abandoning the conversion", drop)
    if dropped:
        log.info("the conversion of requests under way was abandoned; requests is as it was")
    return dropped


@contextlib.contextmanager
def _conversion_lock(engine: Engine) -> Iterator[None]:
    with engine.connect() as conn:
        if not conn.execute(text(f"SELECT pg_try_advisory_lock({CONVERSION_LOCK_KEY})")).scalar():
            raise ConversionError("another `draftwatch db partition` or `db unpartition` is running")
        conn.commit()
        try:
            yield
        finally:
            conn.rollback()
            conn.execute(text(f"SELECT pg_advisory_unlock({CONVERSION_LOCK_KEY})"))
            conn.commit()


def _direction(conn: Connection) -> str:
    return str(conn.execute(text(f"SELECT direction FROM {STATE}")).scalar_one())


def _state(conn: Connection) -> tuple[datetime, datetime, datetime, timedelta, int]:
    """The watermark, the end of the range to copy, its first start, the step and the rows copied so far."""
    row = conn.execute(text(f"SELECT watermark, end_ts, first_ts, step_s, rows_copied FROM {STATE}")).one()
    return row[0], row[1], row[2], timedelta(seconds=row[3]), int(row[4])


def _columns(conn: Connection) -> str:
    rows = conn.execute(
        text(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum"
        ),
        {"t": PARENT},
    )
    return ", ".join(r[0] for r in rows)


def _secondary_indexes(conn: Connection, table: str) -> list[str]:
    """``CREATE INDEX`` statements of ``table``'s indexes that back no key (``pg_get_indexdef``)."""
    rows = conn.execute(
        text(
            "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid = to_regclass(:t) "
            "AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid) ORDER BY i.indexrelid"
        ),
        {"t": table},
    )
    return [str(r[0]) for r in rows]


def _bounds(conn: Connection, after: datetime | None = None) -> tuple[datetime | None, datetime | None]:
    """The first and last ``ts_start`` of ``requests`` (from ``after`` on), read through the (workload, ts_start) index.

    A loose index scan: one probe per workload for the next workload, one for its first and last
    start, where ``min(ts_start)`` would read the whole table (its own index on ts_start is a BRIN).
    """
    floor = "AND r.ts_start >= :after" if after is not None else ""
    row = conn.execute(
        text(
            f"""
            WITH RECURSIVE w(workload) AS (
                SELECT min(workload) FROM {PARENT}
                UNION ALL
                SELECT (SELECT min(workload) FROM {PARENT} WHERE workload > w.workload) FROM w
                WHERE w.workload IS NOT NULL
            )
            SELECT min((SELECT min(ts_start) FROM {PARENT} r WHERE r.workload = w.workload {floor})),
                   max((SELECT max(ts_start) FROM {PARENT} r WHERE r.workload = w.workload))
            FROM w WHERE w.workload IS NOT NULL
            """
        ),
        {"after": after} if after is not None else {},
    ).one()
    return row[0], row[1]


def _prepare(conn: Connection, partitioned: bool, ahead_days: int) -> None:
    if conn.execute(text("SELECT to_regclass(:t)"), {"t": TARGET}).scalar() is not None:
        raise ConversionError(f"a table {TARGET} exists (not made by a conversion under way): drop it first")
    if is_partitioned(conn) == partitioned:
        return
    columns = _columns(conn)
    indexes = _secondary_indexes(conn, PARENT)
    layout = " PARTITION BY RANGE (ts_start)" if partitioned else ""
    conn.execute(text(f"CREATE TABLE {TARGET} (LIKE {PARENT} INCLUDING DEFAULTS){layout}"))
    keys = ("PRIMARY KEY (id, ts_start)", "UNIQUE (request_id, ts_start)", "uq_requests_request_id_ts_start")
    if not partitioned:
        keys = ("PRIMARY KEY (id)", "UNIQUE (request_id)", "uq_requests_request_id")
    conn.execute(text(f"ALTER TABLE {TARGET} ADD CONSTRAINT pk_{PARENT}{CONVERSION_SUFFIX} {keys[0]}"))
    conn.execute(text(f"ALTER TABLE {TARGET} ADD CONSTRAINT {keys[2]}{CONVERSION_SUFFIX} {keys[1]}"))
    for definition in indexes:
        match = _INDEX.match(definition)
        if match is None or (partitioned and match.group(1)):
            log.warning("index not carried over to the %s layout: %s", "partitioned" if partitioned else "plain",
                        definition)  # fmt: skip
            continue
        name = match.group(2).strip('"')
        rest = definition[match.end() :]
        conn.execute(text(f'CREATE {match.group(1) or ""}INDEX "{name}{CONVERSION_SUFFIX}" ON {TARGET} USING {rest}'))
    if partitioned:
        conn.execute(text(f"CREATE TABLE {DEFAULT_PARTITION} PARTITION OF {TARGET} DEFAULT"))
        name_partition_indexes(conn, DEFAULT_PARTITION)
    conn.execute(
        text(
            f"""
            CREATE FUNCTION {MIRROR}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP = 'INSERT' THEN
                    INSERT INTO {TARGET} ({columns}) SELECT {columns} FROM mirrored_new
                    ON CONFLICT DO NOTHING;
                ELSE
                    DELETE FROM {TARGET} t USING mirrored_old o WHERE t.id = o.id AND t.ts_start = o.ts_start;
                END IF;
                RETURN NULL;
            END $$
            """
        )
    )
    # Taking these triggers' lock waits for the writes in flight: every row committed before is visible below.
    conn.execute(
        text(
            f"CREATE TRIGGER {MIRROR}_insert AFTER INSERT ON {PARENT} REFERENCING NEW TABLE AS mirrored_new "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {MIRROR}()"
        )
    )
    conn.execute(
        text(
            f"CREATE TRIGGER {MIRROR}_delete AFTER DELETE ON {PARENT} REFERENCING OLD TABLE AS mirrored_old "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {MIRROR}()"
        )
    )
    first, last = _bounds(conn)
    now = conn.execute(text("SELECT now()")).scalar_one()
    first = first or now
    end = (last + timedelta(microseconds=1)) if last is not None else first
    conn.execute(
        text(
            f"CREATE TABLE {STATE} (direction text NOT NULL, first_ts timestamptz NOT NULL, "
            "watermark timestamptz NOT NULL, end_ts timestamptz NOT NULL, step_s double precision NOT NULL, "
            "rows_copied bigint NOT NULL, batches bigint NOT NULL, started_at timestamptz NOT NULL, "
            "updated_at timestamptz NOT NULL)"
        )
    )
    conn.execute(
        text(
            f"INSERT INTO {STATE} VALUES (:direction, :first, :first, :end, :step, 0, 0, now(), now())"
        ),
        {"direction": "partition" if partitioned else "unpartition", "first": first, "end": end,
         "step": FIRST_STEP.total_seconds()},
    )  # fmt: skip
    if partitioned:  # what the triggers copy from now on lands in its own partition
        for cell_start in _cells(now, now + timedelta(days=ahead_days), 1):
            create_missing(conn, cell_start, cell_start + timedelta(days=1), TARGET)
    log.info("conversion prepared: %s beside %s, ts_start %s to %s to copy", TARGET, PARENT, first, end)


def _cells(start: datetime, end: datetime, days: int) -> Iterator[datetime]:
    cell = grid_start(start, days)
    while cell < end:
        yield cell
        cell += timedelta(days=days)


def _estimate(conn: Connection) -> int | None:
    """Rows of ``requests`` by the statistics, its partitions' when partitioned; None when never analysed."""
    value = conn.execute(
        text(
            "SELECT CASE WHEN c.relkind = 'p' THEN (SELECT sum(greatest(p.reltuples, 0)) FROM pg_inherits i "
            "JOIN pg_class p ON p.oid = i.inhrelid WHERE i.inhparent = c.oid) ELSE c.reltuples END "
            "FROM pg_class c WHERE c.oid = to_regclass(:t)"
        ),
        {"t": PARENT},
    ).scalar()
    return int(value) if value is not None and value > 0 else None


def _copy(
    engine: Engine,
    partitioned: bool,
    partition_days: int,
    batch_rows: int,
    max_batches: int | None,
    progress: Callable[[Progress], None] | None,
) -> tuple[int, int]:
    """Copy batch after batch from the watermark to the end; returns the rows and batches of this run."""
    t0 = time.perf_counter()
    copied = batches = 0
    with engine.connect() as conn:
        columns = _columns(conn)
        estimate = _estimate(conn)
    while max_batches is None or batches < max_batches:
        with engine.connect() as conn:
            watermark, end, first, step, total = _state(conn)
            if watermark >= end:
                break
            # Past the rows' gaps: the next start at or after the watermark.
            following, _ = _bounds(conn, after=watermark)
            conn.rollback()
        if following is None or following >= end:
            with engine.begin() as conn:
                conn.execute(text(f"UPDATE {STATE} SET watermark = end_ts, updated_at = now()"))
            break
        start = max(watermark, following)
        stop = min(start + step, end)
        if partitioned:
            for cell_start in _cells(start, stop, partition_days):
                cell_end = cell_start + timedelta(days=partition_days)
                make = partial(create_missing, start=cell_start, end=cell_end, parent=TARGET)
                with_ddl_retries(engine, f"creating a partition of {TARGET}", make)
        with engine.begin() as conn:
            rows = int(
                conn.execute(
                    text(
                        f"INSERT INTO {TARGET} ({columns}) SELECT {columns} FROM {PARENT} "
                        "WHERE ts_start >= :start AND ts_start < :stop ON CONFLICT DO NOTHING"
                    ),
                    {"start": start, "stop": stop},
                ).rowcount
                or 0
            )
            # The next range as wide as makes about batch_rows rows, growing at most fourfold a batch.
            width = (stop - start) * min(4.0, batch_rows / max(rows, 1))
            width = max(MIN_STEP, min(width, timedelta(days=partition_days)))
            conn.execute(
                text(
                    f"UPDATE {STATE} SET watermark = :stop, step_s = :step, rows_copied = rows_copied + :rows, "
                    "batches = batches + 1, updated_at = now()"
                ),
                {"stop": stop, "step": width.total_seconds(), "rows": rows},
            )
        copied += rows
        batches += 1
        if progress is not None:
            progress(Progress(total + rows, estimate, stop, first, end, time.perf_counter() - t0, copied))
    return copied, batches


def _indexes_of(conn: Connection, table: str) -> list[str]:
    rows = conn.execute(text("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = to_regclass(:t)"),
                        {"t": table})  # fmt: skip
    return [str(r[0]).strip('"') for r in rows]


def _swap(conn: Connection, keep_old: bool) -> None:
    ddl_session(conn)  # the partition lock too: no partition is made or dropped meanwhile
    conn.execute(text(f"LOCK TABLE {PARENT} IN ACCESS EXCLUSIVE MODE"))
    watermark, end, *_ = _state(conn)
    if watermark < end:
        raise ConversionError("the copy has not reached its end")  # never: convert swaps only after it did
    conn.execute(text(f"DROP FUNCTION {MIRROR}() CASCADE"))
    sequence = conn.execute(text(f"SELECT pg_get_serial_sequence('{PARENT}', 'id')")).scalar()
    if sequence is not None:
        conn.execute(text(f"ALTER SEQUENCE {sequence} OWNED BY {TARGET}.id"))
    if keep_old:
        for index in _indexes_of(conn, PARENT):
            conn.execute(text(f'ALTER INDEX "{index}" RENAME TO "{index}{OLD_SUFFIX}"'))
        conn.execute(text(f"ALTER TABLE {PARENT} RENAME TO {PARENT}{OLD_SUFFIX}"))
    else:
        conn.execute(text(f"DROP TABLE {PARENT}"))
    conn.execute(text(f"ALTER TABLE {TARGET} RENAME TO {PARENT}"))
    for index in _indexes_of(conn, PARENT):  # an index backing a key renames its key too
        if index.endswith(CONVERSION_SUFFIX):
            conn.execute(text(f'ALTER INDEX "{index}" RENAME TO "{index.removesuffix(CONVERSION_SUFFIX)}"'))
    conn.execute(text(f"DROP TABLE {STATE}"))
