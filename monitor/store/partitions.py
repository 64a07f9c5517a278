"""The time partitions of ``requests`` and of the rollups on PostgreSQL: created ahead, dropped whole when expired.

On PostgreSQL ``requests`` is partitioned by ``RANGE (ts_start)`` and ``rollup_minute`` and
``rollup_bins`` by ``RANGE (bucket)`` (:data:`TABLES`; migrations 0014 and 0016 on empty tables,
``draftwatch db partition`` online on populated ones, :mod:`monitor.store.repartition`): one
partition per so many days (``database.partition_days`` for requests, :data:`ROLLUP_PARTITION_DAYS`
for the rollups) on a grid anchored at the Unix epoch (UTC midnights), named after its first day
(``requests_p20261203``, ``rollup_bins_p20261203``), plus a default partition each
(``requests_default``), which takes any row no partition's range holds (a clock far off, a spool
replayed after its days' partitions were dropped), so that no record is ever refused for its
timestamp. SQLite keeps one table each: every function here does nothing there, and the code above
the store is the same.

* :func:`ensure_partitions` creates a table's partitions from today's to ``ahead_days`` ahead that do
  not exist (:func:`ensure_all_partitions` every table's), each as a plain table attached with
  ``ATTACH PARTITION`` (a SHARE UPDATE EXCLUSIVE lock on the parent, which readers and writers do
  not wait for, and ACCESS EXCLUSIVE on the default partition while PostgreSQL checks that it holds
  no row of the new range). Rows of that range that landed in the default partition move into the
  new partition first, in the same transaction: PostgreSQL refuses to attach a range the default
  partition has rows of. Only the gaps between existing partitions are created, so a changed width
  never overlaps what exists.
* :func:`drop_expired_partitions` detaches and drops each partition that lies entirely before the
  retention cutoff, each in its own transaction. ``DETACH`` and ``DROP`` take ACCESS EXCLUSIVE on
  the parent (and its default partition) for the few milliseconds of the catalog change. While such
  a statement waits for its lock, every writer that arrives queues behind it: so each attempt waits
  at most :data:`DDL_LOCK_TIMEOUT_MS`, well under a recorder flush, and gives up, and the attempts
  go on, spaced by jittered pauses, until the lock is had or ``wait_s`` has passed
  (:func:`with_ddl_retries`). A long read in the way then costs writers at most that short wait
  per attempt, never the read's duration. ``DETACH PARTITION ... CONCURRENTLY`` (PostgreSQL 14+),
  which takes a weaker lock, is refused on a table with a default partition ("cannot detach
  partitions concurrently when a default partition exists", detaching the default partition itself
  included), and every table here has one. The partial partition at the cutoff is retention's
  (:mod:`monitor.scheduler.retention`).

Both serialise on a transaction-level advisory lock (:data:`PARTITION_LOCK_KEY`), so replicas
running them at once create each partition once; the creation re-reads the partitions under it.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Final, TypeVar

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from monitor.store.types import Fence

log = logging.getLogger(__name__)

PARENT: Final = "requests"
# The rollups are kept retention.rollups_days (400 by default) and read over windows of an hour to some weeks.
# A week a partition makes about 58 of them per table: day-wide ones would make 400 (each opened, with its
# indexes, by a plan that cannot prune, and counted against max_locks_per_transaction, at a plan time that grows
# with them), month-wide ones would keep up to a month past retention behind the edge partition (at the
# 2.5 million rollup_bins rows a day measured at 1M requests a day, 19 GB) and drop in steps of a month. A week
# kept past 400 days is under 2 % more.
ROLLUP_PARTITION_DAYS: Final = 7
# "DRFTWTCP": the migrations' advisory key (monitor.store.migrate) with its last letter changed.
PARTITION_LOCK_KEY: Final = 0x4452465457544350
GRID_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
DEFAULT_PARTITION_DAYS: Final = 1
DEFAULT_AHEAD_DAYS: Final = 7  # database.partitions_ahead_days' default
# How long one partition statement waits for a lock before it gives up (and is tried again): writers that
# arrive meanwhile queue behind it, so this is also the longest they wait for it. Under a quarter of the
# recorder's flush interval (recorder.flush_interval_s, 0.2 s by default).
DDL_LOCK_TIMEOUT_MS: Final = 50
# How long the attempts go on by default: a service's start (monitor.store.migrate) and `db partition` wait no
# longer for their partitions; the retention job passes retention.partition_lock_wait_s.
DDL_WAIT_S: Final = 10.0
# The pause after the first attempt, doubled after each up to DDL_BACKOFF_MAX_S, each drawn between half of
# it and all of it: attempts in step with a reader that comes back at a fixed period would keep missing.
# With the cap, a read that holds the table for long costs writers at most 50 ms a second.
DDL_BACKOFF_S: Final = 0.1
DDL_BACKOFF_MAX_S: Final = 2.0
# The default partition is scanned whenever a partition is attached: say so when it grows.
DEFAULT_ROWS_WARNING: Final = 100_000

# The suffix of the names an online conversion builds beside the live table (monitor.store.repartition).
CONVERSION_SUFFIX: Final = "_next"
_BOUND = re.compile(r"FOR VALUES FROM \('([^']+)'\) TO \('([^']+)'\)")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PartitionedTable:
    """A table PostgreSQL partitions by ``RANGE (key)``, ``days`` wide (None: ``database.partition_days``)."""

    name: str
    key: str
    days: int | None

    @property
    def default_partition(self) -> str:
        return f"{self.name}_default"


REQUESTS: Final = PartitionedTable(PARENT, "ts_start", None)
ROLLUP_MINUTE: Final = PartitionedTable("rollup_minute", "bucket", ROLLUP_PARTITION_DAYS)
ROLLUP_BINS: Final = PartitionedTable("rollup_bins", "bucket", ROLLUP_PARTITION_DAYS)
TABLES: Final = (REQUESTS, ROLLUP_MINUTE, ROLLUP_BINS)


def table_of(parent: str) -> PartitionedTable:
    """The partitioned table ``parent`` is, or whose online conversion builds it (``rollup_bins_next``).

    >>> table_of("rollup_bins_next").key
    'bucket'
    """
    name = parent.removesuffix(CONVERSION_SUFFIX)
    for table in TABLES:
        if table.name == name:
            return table
    raise ValueError(f"{parent!r} is not a table draftwatch partitions: expected one of "
                     f"{', '.join(t.name for t in TABLES)}")  # fmt: skip


class PartitionLockError(RuntimeError):
    """A partition statement found its lock held past :data:`DDL_LOCK_TIMEOUT_MS` on every attempt of its wait."""


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of a partitioned table; ``start`` and ``end`` are None for the default partition."""

    name: str
    start: datetime | None
    end: datetime | None

    @property
    def is_default(self) -> bool:
        return self.start is None


@dataclass(frozen=True, slots=True)
class Dropped:
    """A partition retention dropped, with its row count as the statistics had it (``reltuples``)."""

    name: str
    start: datetime
    end: datetime
    rows_estimate: int


def partition_name(start: datetime, parent: str = PARENT) -> str:
    """``requests_p20261203``; a start off midnight (never made here) gets its time too.

    The partitions of the table an online conversion builds beside ``requests`` have the same names
    (only one partitioned table of requests exists at a time), so the swap renames none of them.

    >>> partition_name(datetime(2026, 12, 3, tzinfo=UTC))
    'requests_p20261203'
    >>> partition_name(datetime(2026, 12, 3, tzinfo=UTC), "rollup_bins_next")
    'rollup_bins_p20261203'
    """
    start = start.astimezone(UTC)
    suffix = f"{start:%Y%m%d}" if start.time() == datetime.min.time() else f"{start:%Y%m%d_%H%M%S}"
    return f"{table_of(parent).name}_p{suffix}"


def grid_start(ts: datetime, days: int) -> datetime:
    """The start of the ``days``-wide partition holding ``ts`` (UTC midnights since the Unix epoch).

    >>> grid_start(datetime(2026, 12, 3, 17, 5, tzinfo=UTC), 1).isoformat()
    '2026-12-03T00:00:00+00:00'
    >>> grid_start(datetime(2026, 12, 3, 17, 5, tzinfo=UTC), 7).isoformat()
    '2026-12-03T00:00:00+00:00'
    """
    whole_days = (ts.astimezone(UTC) - GRID_EPOCH).days
    return GRID_EPOCH + timedelta(days=whole_days - whole_days % days)


def is_partitioned(conn: Connection, table: str = PARENT) -> bool:
    """Whether ``table`` is a partitioned table (PostgreSQL); False on SQLite and for a plain table."""
    if conn.dialect.name != "postgresql":
        return False
    kind = conn.execute(text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:table)"), {"table": table}).scalar()
    return kind == "p"


def list_partitions(conn: Connection, parent: str = PARENT) -> list[Partition]:
    """``parent``'s partitions by start, the default partition last."""
    rows = conn.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(:parent)"
        ),
        {"parent": parent},
    ).all()
    found = []
    for name, bound in rows:
        if bound == "DEFAULT":
            found.append(Partition(name, None, None))
            continue
        match = _BOUND.fullmatch(bound)
        if match is None:  # MINVALUE/MAXVALUE bounds are never made here; such a partition is left alone
            log.warning("partition %s of %s has a bound this code does not read: %s", name, parent, bound)
            continue
        found.append(Partition(name, _timestamp(match.group(1)), _timestamp(match.group(2))))
    return sorted(found, key=lambda p: (p.start is None, p.start or GRID_EPOCH))


def _timestamp(value: str) -> datetime:
    # pg_get_expr renders a timestamptz bound in the session's TimeZone, which _utc_session sets to UTC.
    parsed = datetime.fromisoformat(value.replace(" ", "T"))
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def bound_literal(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S+00")


def columns_of(conn: Connection, table: str) -> list[str]:
    rows = conn.execute(
        text(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(:table) AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum"
        ),
        {"table": table},
    )
    return [r[0] for r in rows]


def ddl_session(conn: Connection) -> None:
    """This transaction's DDL settings: a bounded lock wait, UTC bounds, the partition advisory lock."""
    conn.execute(text(f"SET LOCAL lock_timeout = {DDL_LOCK_TIMEOUT_MS}"))
    conn.execute(text("SET LOCAL TimeZone = 'UTC'"))
    conn.execute(text(f"SELECT pg_advisory_xact_lock({PARTITION_LOCK_KEY})"))


def lock_timed_out(error: OperationalError) -> bool:
    return getattr(error.orig, "sqlstate", None) == "55P03"  # lock_not_available


def with_ddl_retries(engine: Engine, what: str, work: Callable[[Connection], T], *, wait_s: float = DDL_WAIT_S) -> T:
    """Run ``work`` in a transaction of its own; after a lock timeout again, after a jittered pause, for ``wait_s``.

    Each attempt waits at most :data:`DDL_LOCK_TIMEOUT_MS` for a lock (the longest a writer queues
    behind it); the last one starts before ``wait_s`` has passed. Raises :class:`PartitionLockError`
    when every attempt timed out.
    """
    deadline = time.monotonic() + wait_s
    pause = DDL_BACKOFF_S
    attempt = 0
    while True:
        attempt += 1
        try:
            with engine.begin() as conn:
                ddl_session(conn)
                return work(conn)
        except OperationalError as error:
            if not lock_timed_out(error):
                raise
        left = deadline - time.monotonic()
        # Said once at INFO: over a long read the attempts run to a hundred.
        log.log(logging.INFO if attempt == 1 else logging.DEBUG, "%s: a lock was held past %d ms (attempt %d, "
                "tried again for %.1f s more)", what, DDL_LOCK_TIMEOUT_MS, attempt, max(0.0, left))  # fmt: skip
        if left <= 0:
            break
        time.sleep(min(left, random.uniform(pause / 2, pause)))
        pause = min(pause * 2, DDL_BACKOFF_MAX_S)
    raise PartitionLockError(f"{what}: a lock was held past {DDL_LOCK_TIMEOUT_MS} ms on each of {attempt} attempts "
                             f"over {wait_s:g} s (a long read or an idle transaction on the table: see "
                             "pg_stat_activity); it is tried again on the next run")  # fmt: skip


def partition_start(conn: Connection, ts: datetime, parent: str = PARENT) -> datetime | None:
    """The start of ``parent``'s partition whose range holds ``ts``; None when only the default partition does."""
    for p in list_partitions(conn, parent):
        if p.start is not None and p.end is not None and p.start <= ts < p.end:
            return p.start
    return None


def partition_width(partitions: list[Partition]) -> int:
    """The width in days of the newest partition, the layout's own (1 when it has none)."""
    ranged = [p for p in partitions if p.start is not None and p.end is not None]
    if not ranged:
        return DEFAULT_PARTITION_DAYS
    newest = ranged[-1]
    assert newest.start is not None and newest.end is not None
    return max(1, (newest.end - newest.start).days)


def gaps(start: datetime, end: datetime, partitions: list[Partition]) -> Iterator[tuple[datetime, datetime]]:
    """The parts of ``[start, end)`` that no partition's range covers.

    >>> d = lambda day: datetime(2026, 12, day, tzinfo=UTC)
    >>> [(a.day, b.day) for a, b in gaps(d(1), d(8), [Partition("x", d(3), d(5))])]
    [(1, 3), (5, 8)]
    """
    cursor = start
    for p in partitions:
        if p.start is None or p.end is None or p.end <= cursor or p.start >= end:
            continue
        if p.start > cursor:
            yield cursor, p.start
        cursor = max(cursor, p.end)
    if cursor < end:
        yield cursor, end


def wanted_ranges(now: datetime, ahead_days: int, days: int) -> Iterator[tuple[datetime, datetime]]:
    """The grid cells from the one holding ``now`` to the one holding ``now + ahead_days``."""
    cell = grid_start(now, days)
    last = grid_start(now + timedelta(days=ahead_days), days)
    while cell <= last:
        yield cell, cell + timedelta(days=days)
        cell += timedelta(days=days)


def create_partition(conn: Connection, start: datetime, end: datetime, parent: str = PARENT) -> int:
    """Create and attach the partition ``[start, end)`` of ``parent`` in ``conn``'s transaction.

    Rows of that range in the default partition move into it first (PostgreSQL refuses to attach a
    range the default partition holds rows of); returns how many moved. The caller holds
    :func:`ddl_session`'s settings and has checked that the range overlaps no partition.
    """
    name = partition_name(start, parent)
    key = table_of(parent).key
    default = next((p.name for p in list_partitions(conn, parent) if p.is_default), None)
    conn.execute(text(f"CREATE TABLE {name} (LIKE {parent} INCLUDING DEFAULTS)"))
    moved = 0
    if default is not None:
        # Writers routed to the default partition wait from here to the commit; no one else does.
        conn.execute(text(f"LOCK TABLE {default} IN ACCESS EXCLUSIVE MODE"))
        columns = ", ".join(columns_of(conn, parent))
        moved = int(
            conn.execute(
                text(
                    f"WITH moved AS (DELETE FROM {default} WHERE {key} >= :start AND {key} < :end "
                    f"RETURNING {columns}) INSERT INTO {name} ({columns}) SELECT {columns} FROM moved"
                ),
                {"start": start, "end": end},
            ).rowcount
            or 0
        )
    bounds = f"FROM ('{bound_literal(start)}') TO ('{bound_literal(end)}')"
    conn.execute(text(f"ALTER TABLE {parent} ATTACH PARTITION {name} FOR VALUES {bounds}"))
    name_partition_indexes(conn, name, parent)
    return moved


def name_partition_indexes(conn: Connection, partition: str, parent: str = PARENT) -> None:
    """Name each index of ``partition`` of ``parent`` after the parent's: ``ix_requests_workload_ts_p20261203``.

    PostgreSQL names them after the columns; these names say in a plan which index of the table
    served, as on the unpartitioned table. A parent index still named ``..._next`` (an online
    conversion, :mod:`monitor.store.repartition`) gives the name it will have after the swap.
    """
    suffix = partition.removeprefix(f"{table_of(parent).name}_")
    rows = conn.execute(
        text(
            "SELECT child.relname, parent.relname FROM pg_index i "
            "JOIN pg_class child ON child.oid = i.indexrelid "
            "JOIN pg_inherits h ON h.inhrelid = i.indexrelid JOIN pg_class parent ON parent.oid = h.inhparent "
            "WHERE i.indrelid = to_regclass(:partition)"
        ),
        {"partition": partition},
    ).all()
    for child, parent_index in rows:
        wanted = f"{parent_index.removesuffix(CONVERSION_SUFFIX)}_{suffix}"[:63]
        if child != wanted:
            conn.execute(text(f'ALTER INDEX "{child}" RENAME TO "{wanted}"'))


def ensure_partitions(
    engine: Engine,
    now: datetime,
    ahead_days: int,
    *,
    partition_days: int | None = None,
    parent: str = PARENT,
    wait_s: float = DDL_WAIT_S,
) -> list[str]:
    """Create ``parent``'s missing partitions from ``now``'s to ``ahead_days`` ahead; returns their names.

    ``partition_days`` None keeps the width of the newest partition. Does nothing on SQLite or when
    ``parent`` is not partitioned (an installation not converted yet). Idempotent, and safe when
    replicas run it at once (see the module docstring).
    """
    if engine.dialect.name != "postgresql":
        return []
    with engine.connect() as conn:
        if not is_partitioned(conn, parent):
            return []
        conn.execute(text("SET TimeZone = 'UTC'"))
        existing = list_partitions(conn, parent)
        conn.rollback()
    days = partition_days or partition_width(existing)
    missing = [gap for cell in wanted_ranges(now, ahead_days, days) for gap in gaps(*cell, existing)]
    created: list[str] = []
    for start, end in missing:  # one transaction each: the default partition's lock is held for one at a time
        what = f"creating the {parent} partition from {start:%Y-%m-%d}"
        make = partial(create_missing, start=start, end=end, parent=parent)
        created += with_ddl_retries(engine, what, make, wait_s=wait_s)
    return created


def ensure_all_partitions(
    engine: Engine, now: datetime, ahead_days: int, *, partition_days: int | None = None, wait_s: float = DDL_WAIT_S
) -> list[str]:
    """:func:`ensure_partitions` for every table of :data:`TABLES`, each at its width; returns the names made.

    ``partition_days`` is requests' width (None keeps its newest partition's). A table whose locks
    stayed held does not keep the others from getting theirs: its :class:`PartitionLockError` is
    raised after them.
    """
    created: list[str] = []
    failed: PartitionLockError | None = None
    for table in TABLES:
        try:
            created += ensure_partitions(engine, now, ahead_days, partition_days=table.days or partition_days,
                                         parent=table.name, wait_s=wait_s)  # fmt: skip
        except PartitionLockError as error:
            log.warning("%s", error)
            failed = failed or error
    if failed is not None:
        raise failed
    return created


def create_missing(conn: Connection, start: datetime, end: datetime, parent: str) -> list[str]:
    # Under the advisory lock: another replica may have created this range since it was read.
    made = []
    for gap_start, gap_end in list(gaps(start, end, list_partitions(conn, parent))):
        moved = create_partition(conn, gap_start, gap_end, parent)
        name = partition_name(gap_start, parent)
        if moved:
            log.info("partition %s of %s created [%s, %s), %d rows moved into it from the default partition", name,
                     parent, bound_literal(gap_start), bound_literal(gap_end), moved)  # fmt: skip
        else:
            log.info("partition %s of %s created [%s, %s)", name, parent, bound_literal(gap_start),
                     bound_literal(gap_end))  # fmt: skip
        made.append(name)
    if made:
        _warn_of_default(conn, table_of(parent).default_partition)
    return made


def _warn_of_default(conn: Connection, default: str) -> None:
    rows = conn.execute(text("SELECT reltuples FROM pg_class WHERE oid = to_regclass(:d)"), {"d": default}).scalar()
    if rows is not None and rows > DEFAULT_ROWS_WARNING:
        log.warning("the default partition %s holds about %d rows: it is scanned each time a partition is created; "
                    "see docs/postgresql.md", default, int(rows))  # fmt: skip


def drop_expired_partitions(
    engine: Engine, cutoff: datetime, fence: Fence | None = None, *, parent: str = PARENT, wait_s: float = DDL_WAIT_S
) -> list[Dropped]:
    """Detach and drop every partition of ``parent`` that ends at or before ``cutoff``, one transaction each.

    ``fence`` is checked last in each transaction, so a replica that lost the scheduler's lease
    drops nothing more. The default partition is never dropped. Does nothing on SQLite or when
    ``parent`` is not partitioned. Raises :class:`PartitionLockError` when a partition's locks stayed
    held on every attempt for ``wait_s`` (the partitions before it are dropped).
    """
    if engine.dialect.name != "postgresql":
        return []
    with engine.connect() as conn:
        if not is_partitioned(conn, parent):
            return []
        conn.execute(text("SET TimeZone = 'UTC'"))
        expired = [p for p in list_partitions(conn, parent) if p.end is not None and p.end <= cutoff]
        conn.rollback()
    dropped: list[Dropped] = []
    for partition in expired:
        what = f"dropping the partition {partition.name}"
        drop = partial(_drop, partition=partition, cutoff=cutoff, parent=parent, fence=fence)
        done = with_ddl_retries(engine, what, drop, wait_s=wait_s)
        if done is not None:
            dropped.append(done)
    return dropped


def _drop(conn: Connection, partition: Partition, cutoff: datetime, parent: str, fence: Fence | None) -> Dropped | None:
    current = {p.name: p for p in list_partitions(conn, parent)}.get(partition.name)
    if current is None or current.start is None or current.end is None or current.end > cutoff:
        return None  # another replica dropped it meanwhile
    t0 = time.perf_counter()
    rows = conn.execute(
        text("SELECT reltuples FROM pg_class WHERE oid = to_regclass(:p)"), {"p": partition.name}
    ).scalar()
    conn.execute(text(f"ALTER TABLE {parent} DETACH PARTITION {partition.name}"))
    conn.execute(text(f"DROP TABLE {partition.name}"))
    if fence is not None:
        fence(conn)
    estimate = max(0, int(rows or 0))
    log.info("partition %s [%s, %s) dropped, about %d rows (%.0f ms in its statements)", partition.name,
             bound_literal(current.start), bound_literal(current.end), estimate,
             (time.perf_counter() - t0) * 1000)  # fmt: skip
    return Dropped(partition.name, current.start, current.end, estimate)
