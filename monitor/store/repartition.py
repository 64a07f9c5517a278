"""Tables converted between their plain and their partitioned layout online (PostgreSQL).

``draftwatch db partition`` converts an installation whose ``requests`` held rows when migration
0014 ran, or whose rollups (``rollup_minute``, ``rollup_bins``) held rows when 0016 ran (both
convert only empty tables); ``draftwatch db unpartition`` is the way back. :func:`convert` takes
each table of :data:`CONVERTIBLE` in turn (requests first), in three steps, each its own short
transaction or series of them; the names below are requests', a rollup table's are its own
(``rollup_bins_next``, ``rollup_bins_conversion``):

1. **Prepare** (one transaction): the new table ``requests_next`` beside ``requests``, in the other
   layout, with the same columns and id sequence, its keys and every secondary index of
   ``requests`` (named ``..._next`` until the swap); for the partitioned layout its default
   partition and the partitions from today to ``ahead_days`` ahead. Then, last, statement-level
   triggers on ``requests`` copy every row inserted (and delete every row deleted) from then on
   into the new table, through their transition tables, so rows written during the conversion are
   there when it ends. Creating a trigger takes a lock that writers wait for until the commit, so
   only the triggers and the read of the range to copy come after it: the range of the partition
   key is read after the triggers exist, so that every row committed before them lies in it. The
   state (how far the copy got) is the row of ``requests_conversion``.
2. **Copy**, in batches by ranges of the partition key, oldest first, each a transaction that
   copies one range (``INSERT ... SELECT ... ON CONFLICT DO NOTHING``: a row the triggers copied
   already is skipped) and moves the state's watermark past it. A range's width adapts so that a
   batch copies about ``batch_rows`` rows; ranges without rows are skipped through an index.
   Interrupted anywhere (Ctrl-C, a kill, ``max_batches``), the next run goes on from the
   watermark. The partitions a range needs are created before it is copied.
3. **Swap** (one transaction, ``ACCESS EXCLUSIVE`` on ``requests`` for a few catalog changes):
   the triggers dropped, the sequence handed to the new table, the old table dropped (or kept as
   ``requests_old`` with ``keep_old``), the new one renamed ``requests`` with its indexes' and
   keys' final names. Writers wait for it, not longer than the swap takes: no row is copied there.

Rows of ``requests`` are never updated by draftwatch, so updates are not copied there. Rollup rows
are (the writer adds each batch's counts into its minutes' rows): on a rollup table a third trigger
copies each updated row as it now is, by the rollup key (``INSERT ... ON CONFLICT (key) DO UPDATE``),
so that the copy and the triggers meet on that key: whichever inserts a row second waits for the
first and then skips it (the copy) or overwrites it with the newer row (a trigger). Both insert in
key order, so that they never wait for each other in a cycle.

While a table is converted the application goes on writing and reading it as before (its writes
cost about twice as much: each row is written twice), and retention leaves that table alone
(:func:`conversion_in_progress`). A conversion can be abandoned with :func:`abort`, which drops
what the preparations made. A ``TRUNCATE`` during a conversion is not copied.

Converting requests back to the plain layout keeps one row per request id: two rows with the same
id and different starts (which the partitioned table's unique key allows) keep the one copied first.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Final

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from monitor.store.models import ROLLUP_KEY
from monitor.store.partitions import (
    CONVERSION_SUFFIX,
    REQUESTS,
    ROLLUP_BINS,
    ROLLUP_MINUTE,
    PartitionedTable,
    columns_of,
    create_missing,
    ddl_session,
    ensure_partitions,
    grid_start,
    is_partitioned,
    name_partition_indexes,
    with_ddl_retries,
)

log = logging.getLogger(__name__)

OLD_SUFFIX: Final = "_old"
# "DRFTWTCC": one conversion at a time (a session-level lock, held while a run copies).
CONVERSION_LOCK_KEY: Final = 0x4452465457544343
MIN_STEP: Final = timedelta(seconds=1)
FIRST_STEP: Final = timedelta(minutes=10)
_INDEX = re.compile(r"^CREATE (UNIQUE )?INDEX (\S+) ON (ONLY )?(\S+) USING ")


@dataclass(frozen=True, slots=True)
class Convertible:
    """What converting one table takes beyond its partitioning: its unique key per layout, how its rows change.

    ``unique`` maps the layout (partitioned or not) to the unique key's name and columns. ``updated``:
    its rows are updated in place (the rollups' upsert), so the triggers copy updates too, by the
    unique key, which must then be the same in both layouts. ``loose_bounds``: the partition key has
    no btree index leading with it (requests' is a BRIN), so its first and last value are found
    through the ``(workload, key)`` index, one probe per workload.
    """

    table: PartitionedTable
    unique: dict[bool, tuple[str, str]]
    updated: bool
    loose_bounds: bool

    @property
    def name(self) -> str:
        return self.table.name

    @property
    def target(self) -> str:
        return self.name + CONVERSION_SUFFIX

    @property
    def state(self) -> str:
        return f"{self.name}_conversion"

    @property
    def mirror(self) -> str:
        return f"{self.name}_conversion_mirror"


def _rollup(table: PartitionedTable, key: tuple[str, ...]) -> Convertible:
    unique = (f"uq_{table.name}_key", ", ".join(key))
    return Convertible(table, {True: unique, False: unique}, updated=True, loose_bounds=False)


CONVERTIBLE: Final = {
    c.name: c
    for c in (
        Convertible(
            REQUESTS,
            {
                True: ("uq_requests_request_id_ts_start", "request_id, ts_start"),
                False: ("uq_requests_request_id", "request_id"),
            },
            updated=False,
            loose_bounds=True,
        ),
        _rollup(ROLLUP_MINUTE, ROLLUP_KEY),
        _rollup(ROLLUP_BINS, (*ROLLUP_KEY, "metric", "bin")),
    )
}
ALL_TABLES: Final = tuple(CONVERTIBLE)  # in the order a conversion takes them


class ConversionError(RuntimeError):
    """The conversion cannot run: not PostgreSQL, another one running, one in the other direction under way."""


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a table's conversion stands after a batch."""

    table: str
    rows_copied: int
    rows_estimate: int | None  # rows of the table by the statistics (reltuples), None before any ANALYZE
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
        """``requests: copied 1,234,567 of about 9,876,543 rows (12.5 %), 45,678 rows/s, ETA 0:03:12, up to ...``."""
        of = f" of about {self.rows_estimate:,}" if self.rows_estimate else ""
        eta = "-" if self.eta_s is None else str(timedelta(seconds=round(self.eta_s)))
        return (f"{self.table}: copied {self.rows_copied:,}{of} rows ({100 * self.fraction:.1f} %), "
                f"{self.rows_per_s:,.0f} rows/s, ETA {eta}, up to {self.watermark:%Y-%m-%d %H:%M:%S}")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a run ended: ``converted``, ``paused`` (``max_batches`` reached; run again) or ``already``.

    ``tables`` are those this run swapped (``converted``), or the one it paused in.
    """

    state: str
    rows_copied: int
    batches: int
    tables: tuple[str, ...] = ()


def conversion_in_progress(conn: Connection, table: str = REQUESTS.name) -> bool:
    """Whether an online conversion of ``table`` is under way (its state table exists); False on SQLite."""
    if conn.dialect.name != "postgresql":
        return False
    return conn.execute(text("SELECT to_regclass(:t)"), {"t": CONVERTIBLE[table].state}).scalar() is not None


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
    tables: Sequence[str] = ALL_TABLES,
) -> Outcome:
    """Convert ``tables`` to the partitioned layout (``partitioned``) or back, online; see the module docstring.

    ``partition_days`` is the width of requests' partitions (the rollups have theirs). Tables are
    converted one after the other; ``max_batches`` counts the batches of all of them, and a run that
    reaches it stops in the table it was copying.
    """
    if engine.dialect.name != "postgresql":
        raise ConversionError("only PostgreSQL partitions tables; SQLite keeps one table each")
    wanted = "partition" if partitioned else "unpartition"
    converted: list[str] = []
    paused: str | None = None
    copied = batches = 0
    with _conversion_lock(engine):
        with engine.connect() as conn:
            for name in tables:
                if conversion_in_progress(conn, name) and (direction := _direction(conn, name)) != wanted:
                    raise ConversionError(f"a conversion of {name} ({direction}) is under way: finish it, or "
                                          "abandon it with --abort")  # fmt: skip
        for name in tables:
            table = CONVERTIBLE[name]
            width = table.table.days or partition_days
            with engine.connect() as conn:
                converting, already = conversion_in_progress(conn, name), is_partitioned(conn, name) == partitioned
            budget = None if max_batches is None else max_batches - batches
            if not converting:
                if already:
                    continue
                if budget is not None and budget <= 0:  # not begun: nothing of it to write twice meanwhile
                    paused = name
                    break
                prepare = partial(_prepare, table=table, partitioned=partitioned, width=width, ahead_days=ahead_days)
                with_ddl_retries(engine, f"preparing the conversion of {name}", prepare)
            rows, done = _copy(engine, table, partitioned, width, batch_rows, budget, progress)
            copied, batches = copied + rows, batches + done
            with engine.connect() as conn:
                watermark, end, *_ = _state(conn, table)
            if watermark < end:
                paused = name
                break
            with_ddl_retries(engine, f"swapping {name}", partial(_swap, table=table, keep_old=keep_old))
            log.info("%s converted (%s): %d rows copied in this run", name, wanted, rows)
            converted.append(name)
    if partitioned:
        for name in converted:
            width = CONVERTIBLE[name].table.days or partition_days
            ensure_partitions(engine, datetime.now(UTC), ahead_days, partition_days=width, parent=name)
    if paused is not None:
        return Outcome("paused", copied, batches, (paused,))
    return Outcome("converted" if converted else "already", copied, batches, tuple(converted))


def abort(engine: Engine, tables: Sequence[str] = ALL_TABLES) -> list[str]:
    """Abandon the conversions under way: their triggers, new tables and states dropped; returns their tables."""
    if engine.dialect.name != "postgresql":
        return []
    abandoned = []
    with _conversion_lock(engine):
        for name in tables:
            table = CONVERTIBLE[name]

            def drop(conn: Connection, table: Convertible = table) -> bool:
                if not conversion_in_progress(conn, table.name):
                    return False
                conn.execute(text(f"DROP FUNCTION {table.mirror}() CASCADE"))  # and the triggers calling it
                conn.execute(text(f"DROP TABLE {table.target}"))
                conn.execute(text(f"DROP TABLE {table.state}"))
                return True

            if with_ddl_retries(engine, f"abandoning the conversion of {name}", drop):
                log.info("the conversion of %s under way was abandoned; %s is as it was", name, name)
                abandoned.append(name)
    return abandoned


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


def _direction(conn: Connection, name: str) -> str:
    return str(conn.execute(text(f"SELECT direction FROM {CONVERTIBLE[name].state}")).scalar_one())


def _state(conn: Connection, table: Convertible) -> tuple[datetime, datetime, datetime, timedelta, int]:
    """The watermark, the end of the range to copy, its first key, the step and the rows copied so far."""
    row = conn.execute(text(f"SELECT watermark, end_ts, first_ts, step_s, rows_copied FROM {table.state}")).one()
    return row[0], row[1], row[2], timedelta(seconds=row[3]), int(row[4])


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


def _bounds(
    conn: Connection, table: Convertible, after: datetime | None = None
) -> tuple[datetime | None, datetime | None]:
    """The first (from ``after`` on) and the last value of ``table``'s partition key.

    Requests' through the (workload, ts_start) index, by a loose index scan: one probe per workload
    for the next workload, one for its first and last start, where ``min(ts_start)`` would read the
    whole table (its own index on ts_start is a BRIN). A rollup table's unique key leads with its
    bucket: two probes.
    """
    name, key = table.name, table.table.key
    floor = f"AND r.{key} >= :after" if after is not None else ""
    if table.loose_bounds:
        query = f"""
            WITH RECURSIVE w(workload) AS (
                SELECT min(workload) FROM {name}
                UNION ALL
                SELECT (SELECT min(workload) FROM {name} WHERE workload > w.workload) FROM w
                WHERE w.workload IS NOT NULL
            )
            SELECT min((SELECT min({key}) FROM {name} r WHERE r.workload = w.workload {floor})),
                   max((SELECT max({key}) FROM {name} r WHERE r.workload = w.workload))
            FROM w WHERE w.workload IS NOT NULL
            """
    else:
        query = f"SELECT (SELECT min({key}) FROM {name} r WHERE true {floor}), (SELECT max({key}) FROM {name})"
    row = conn.execute(text(query), {"after": after} if after is not None else {}).one()
    return row[0], row[1]


def _prepare(conn: Connection, table: Convertible, partitioned: bool, width: int, ahead_days: int) -> None:
    name, target, key = table.name, table.target, table.table.key
    if conn.execute(text("SELECT to_regclass(:t)"), {"t": target}).scalar() is not None:
        raise ConversionError(f"a table {target} exists (not made by a conversion under way): drop it first")
    if is_partitioned(conn, name) == partitioned:
        return
    columns = ", ".join(columns_of(conn, name))
    indexes = _secondary_indexes(conn, name)
    layout = f" PARTITION BY RANGE ({key})" if partitioned else ""
    conn.execute(text(f"CREATE TABLE {target} (LIKE {name} INCLUDING DEFAULTS){layout}"))
    primary = f"PRIMARY KEY (id, {key})" if partitioned else "PRIMARY KEY (id)"
    unique, unique_columns = table.unique[partitioned]
    conn.execute(text(f"ALTER TABLE {target} ADD CONSTRAINT pk_{name}{CONVERSION_SUFFIX} {primary}"))
    conn.execute(text(f"ALTER TABLE {target} ADD CONSTRAINT {unique}{CONVERSION_SUFFIX} UNIQUE ({unique_columns})"))
    for definition in indexes:
        match = _INDEX.match(definition)
        if match is None or (partitioned and match.group(1)):
            log.warning("index not carried over to the %s layout: %s", "partitioned" if partitioned else "plain",
                        definition)  # fmt: skip
            continue
        index = match.group(2).strip('"')
        rest = definition[match.end() :]
        conn.execute(text(f'CREATE {match.group(1) or ""}INDEX "{index}{CONVERSION_SUFFIX}" ON {target} USING {rest}'))
    now = conn.execute(text("SELECT now()")).scalar_one()
    if partitioned:
        conn.execute(text(f"CREATE TABLE {table.table.default_partition} PARTITION OF {target} DEFAULT"))
        name_partition_indexes(conn, table.table.default_partition, target)
        # What the triggers copy from now on lands in its own partition. Made before the triggers: from the
        # first trigger to the commit every writer of the table waits, so nothing but them and the bounds read
        # happens there (making a week of partitions held writers 0.3-0.4 s).
        for cell_start in _cells(now, now + timedelta(days=ahead_days), width):
            create_missing(conn, cell_start, cell_start + timedelta(days=width), target)
    conn.execute(
        text(
            f"CREATE TABLE {table.state} (direction text NOT NULL, first_ts timestamptz NOT NULL, "
            "watermark timestamptz NOT NULL, end_ts timestamptz NOT NULL, step_s double precision NOT NULL, "
            "rows_copied bigint NOT NULL, batches bigint NOT NULL, started_at timestamptz NOT NULL, "
            "updated_at timestamptz NOT NULL)"
        )
    )
    if table.updated:  # the rows as they are now, in key order (see the module docstring)
        kept = {"id", *unique_columns.split(", ")}
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns.split(", ") if c not in kept)
        insert = (f"INSERT INTO {target} ({columns}) SELECT {columns} FROM mirrored_new ORDER BY {unique_columns} "
                  f"ON CONFLICT ({unique_columns}) DO UPDATE SET {updates}")  # fmt: skip
    else:
        insert = f"INSERT INTO {target} ({columns}) SELECT {columns} FROM mirrored_new ON CONFLICT DO NOTHING"
    conn.execute(
        text(
            f"""
            CREATE FUNCTION {table.mirror}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP = 'DELETE' THEN
                    DELETE FROM {target} t USING mirrored_old o WHERE t.id = o.id AND t.{key} = o.{key};
                ELSE
                    {insert};
                END IF;
                RETURN NULL;
            END $$
            """
        )
    )
    # Taking these triggers' lock waits for the writes in flight: every row committed before is visible below.
    events = [("insert", "INSERT", "NEW TABLE AS mirrored_new"), ("delete", "DELETE", "OLD TABLE AS mirrored_old")]
    if table.updated:
        events.append(("update", "UPDATE", "NEW TABLE AS mirrored_new"))
    for suffix, event, transition in events:
        conn.execute(
            text(
                f"CREATE TRIGGER {table.mirror}_{suffix} AFTER {event} ON {name} REFERENCING {transition} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION {table.mirror}()"
            )
        )
    first, last = _bounds(conn, table)
    first = first or now
    end = (last + timedelta(microseconds=1)) if last is not None else first
    conn.execute(
        text(
            f"INSERT INTO {table.state} VALUES (:direction, :first, :first, :end, :step, 0, 0, now(), now())"
        ),
        {"direction": "partition" if partitioned else "unpartition", "first": first, "end": end,
         "step": FIRST_STEP.total_seconds()},
    )  # fmt: skip
    log.info("conversion prepared: %s beside %s, %s %s to %s to copy", target, name, key, first, end)


def _cells(start: datetime, end: datetime, days: int) -> Iterator[datetime]:
    cell = grid_start(start, days)
    while cell < end:
        yield cell
        cell += timedelta(days=days)


def _estimate(conn: Connection, table: str) -> int | None:
    """Rows of ``table`` by the statistics, its partitions' when partitioned; None when never analysed."""
    value = conn.execute(
        text(
            "SELECT CASE WHEN c.relkind = 'p' THEN (SELECT sum(greatest(p.reltuples, 0)) FROM pg_inherits i "
            "JOIN pg_class p ON p.oid = i.inhrelid WHERE i.inhparent = c.oid) ELSE c.reltuples END "
            "FROM pg_class c WHERE c.oid = to_regclass(:t)"
        ),
        {"t": table},
    ).scalar()
    return int(value) if value is not None and value > 0 else None


def _copy(
    engine: Engine,
    table: Convertible,
    partitioned: bool,
    width_days: int,
    batch_rows: int,
    max_batches: int | None,
    progress: Callable[[Progress], None] | None,
) -> tuple[int, int]:
    """Copy batch after batch from the watermark to the end; returns the rows and batches of this run."""
    t0 = time.perf_counter()
    copied = batches = 0
    name, target, key = table.name, table.target, table.table.key
    with engine.connect() as conn:
        columns = ", ".join(columns_of(conn, name))
        estimate = _estimate(conn, name)
    # In the triggers' order, for a table whose rows they update (see the module docstring).
    order = f" ORDER BY {table.unique[partitioned][1]}" if table.updated else ""
    while max_batches is None or batches < max_batches:
        with engine.connect() as conn:
            watermark, end, first, step, total = _state(conn, table)
            if watermark >= end:
                break
            # Past the rows' gaps: the next key at or after the watermark.
            following, _ = _bounds(conn, table, after=watermark)
            conn.rollback()
        if following is None or following >= end:
            with engine.begin() as conn:
                conn.execute(text(f"UPDATE {table.state} SET watermark = end_ts, updated_at = now()"))
            break
        start = max(watermark, following)
        stop = min(start + step, end)
        if partitioned:
            for cell_start in _cells(start, stop, width_days):
                cell_end = cell_start + timedelta(days=width_days)
                make = partial(create_missing, start=cell_start, end=cell_end, parent=target)
                with_ddl_retries(engine, f"creating a partition of {target}", make)
        with engine.begin() as conn:
            rows = int(
                conn.execute(
                    text(
                        f"INSERT INTO {target} ({columns}) SELECT {columns} FROM {name} "
                        f"WHERE {key} >= :start AND {key} < :stop{order} ON CONFLICT DO NOTHING"
                    ),
                    {"start": start, "stop": stop},
                ).rowcount
                or 0
            )
            # The next range as wide as makes about batch_rows rows, growing at most fourfold a batch.
            width = (stop - start) * min(4.0, batch_rows / max(rows, 1))
            width = max(MIN_STEP, min(width, timedelta(days=width_days)))
            conn.execute(
                text(
                    f"UPDATE {table.state} SET watermark = :stop, step_s = :step, rows_copied = rows_copied + :rows, "
                    "batches = batches + 1, updated_at = now()"
                ),
                {"stop": stop, "step": width.total_seconds(), "rows": rows},
            )
        copied += rows
        batches += 1
        if progress is not None:
            progress(Progress(name, total + rows, estimate, stop, first, end, time.perf_counter() - t0, copied))
    return copied, batches


def _indexes_of(conn: Connection, table: str) -> list[str]:
    rows = conn.execute(text("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = to_regclass(:t)"),
                        {"t": table})  # fmt: skip
    return [str(r[0]).strip('"') for r in rows]


def _swap(conn: Connection, table: Convertible, keep_old: bool) -> None:
    name, target = table.name, table.target
    ddl_session(conn)  # the partition lock too: no partition is made or dropped meanwhile
    conn.execute(text(f"LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE"))
    watermark, end, *_ = _state(conn, table)
    if watermark < end:
        raise ConversionError("the copy has not reached its end")  # never: convert swaps only after it did
    conn.execute(text(f"DROP FUNCTION {table.mirror}() CASCADE"))
    sequence = conn.execute(text(f"SELECT pg_get_serial_sequence('{name}', 'id')")).scalar()
    if sequence is not None:
        conn.execute(text(f"ALTER SEQUENCE {sequence} OWNED BY {target}.id"))
    if keep_old:
        for index in _indexes_of(conn, name):
            conn.execute(text(f'ALTER INDEX "{index}" RENAME TO "{index}{OLD_SUFFIX}"'))
        conn.execute(text(f"ALTER TABLE {name} RENAME TO {name}{OLD_SUFFIX}"))
    else:
        conn.execute(text(f"DROP TABLE {name}"))
    conn.execute(text(f"ALTER TABLE {target} RENAME TO {name}"))
    for index in _indexes_of(conn, name):  # an index backing a key renames its key too
        if index.endswith(CONVERSION_SUFFIX):
            conn.execute(text(f'ALTER INDEX "{index}" RENAME TO "{index.removesuffix(CONVERSION_SUFFIX)}"'))
    conn.execute(text(f"DROP TABLE {table.state}"))
