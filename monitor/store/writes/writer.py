"""One recorder batch, one transaction: the batch marker, the records, model versions and rollups.

Statements run in a fixed order (batch marker, requests sorted by ``request_id``, model versions,
rollups sorted by key) so that concurrent writers on PostgreSQL take row locks in the same order and
cannot deadlock. The batch marker makes a batch idempotent as a whole: a batch whose id is already
in ``recorder_batches`` was committed before (e.g. replayed from the spool after a crash that came
between commit and spool truncation) and is skipped without counting its records as duplicates.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from sqlalchemy import Table, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from decoder.record import RequestRecord
from monitor.store import rollups
from monitor.store.models import (
    ROLLUP_KEY,
    DeploymentEventRow,
    ModelVersionRow,
    RecorderBatchRow,
    RequestRow,
    RollupBinRow,
    RollupMinuteRow,
)
from monitor.store.writes.bulk import insert_requests, insert_returning, upsert_add

_HOST: Final = socket.gethostname()

REQUESTS: Final[Table] = RequestRow.__table__  # type: ignore[assignment]
BATCHES: Final[Table] = RecorderBatchRow.__table__  # type: ignore[assignment]
VERSIONS: Final[Table] = ModelVersionRow.__table__  # type: ignore[assignment]
EVENTS: Final[Table] = DeploymentEventRow.__table__  # type: ignore[assignment]
MINUTES: Final[Table] = RollupMinuteRow.__table__  # type: ignore[assignment]
BINS: Final[Table] = RollupBinRow.__table__  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What one batch did: ``applied`` is False when the batch had been committed before.

    ``new`` holds the records this batch stored (its duplicates left out), for counters that must
    count a re-sent record once.
    """

    applied: bool
    duplicates: int
    new: tuple[RequestRecord, ...] = ()

    @property
    def stored(self) -> int:
        return len(self.new)


def _insert(conn: Connection, table: Table) -> Any:
    dialect = conn.dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise ValueError(f"unsupported dialect {dialect}")


def write_batch(conn: Connection, records: Sequence[RequestRecord], batch_id: str, origin: str) -> BatchOutcome:
    """Write validated ``records`` as one batch inside the caller's transaction."""
    return write_batches(conn, [(batch_id, records)], origin)[0]


def write_batches(
    conn: Connection, batches: Sequence[tuple[str, Sequence[RequestRecord]]], origin: str, *, pid: int | None = None
) -> list[BatchOutcome]:
    """Write several batches in the caller's one transaction (spool replay coalesces small lines).

    Returns one outcome per batch, in order. A record whose ``request_id`` appears in several
    batches is stored at most once and counted as a duplicate everywhere else. ``pid`` is the recording
    process's, where a writer process commits for it.
    """
    now = datetime.now(UTC)
    markers = [
        {
            "batch_id": batch_id,
            "origin": origin,
            "n_records": len(records),
            "committed_at": now,
            "host": _HOST,
            "pid": os.getpid() if pid is None else pid,
        }
        for batch_id, records in batches
    ]
    # The marker goes first: on SQLite it takes the write lock before anything is read, on
    # PostgreSQL it makes a concurrent replay of the same batch wait for this one and then skip.
    if len(markers) == 1:
        marker = _insert(conn, BATCHES).on_conflict_do_nothing(index_elements=["batch_id"])
        inserted = conn.execute(marker.values(**markers[0]).returning(BATCHES.c.batch_id)).scalars().all()
        applied = set(inserted)
    else:
        applied = set(insert_returning(conn, BATCHES, markers, conflict=["batch_id"], returning="batch_id"))

    unique: dict[str, RequestRecord] = {}
    for batch_id, records in batches:
        if batch_id in applied:
            for rec in records:
                unique.setdefault(rec.request_id, rec)  # a repeat inside the write is a duplicate too
    ordered = [unique[key] for key in sorted(unique)]
    stored_ids = insert_requests(conn, ordered, now)
    stored = [rec for rec in ordered if rec.request_id in stored_ids]
    if stored:
        _record_versions(conn, stored)
        _apply_rollups(conn, rollups.compute(stored))

    outcomes = []
    for batch_id, records in batches:
        if batch_id not in applied:
            outcomes.append(BatchOutcome(applied=False, duplicates=0))
            continue
        new = []
        for rec in records:
            if rec.request_id in stored_ids and unique.get(rec.request_id) is rec:
                stored_ids.discard(rec.request_id)  # credit each stored id to one batch only
                new.append(rec)
        outcomes.append(BatchOutcome(applied=True, duplicates=len(records) - len(new), new=tuple(new)))
    return outcomes


def _apply_rollups(conn: Connection, delta: rollups.RollupDelta) -> None:
    upsert_add(conn, MINUTES, delta.minutes, conflict=ROLLUP_KEY, add=rollups.SUM_COLUMNS)
    upsert_add(conn, BINS, delta.bins, conflict=[*ROLLUP_KEY, "metric", "bin"], add=["count"])


def _record_versions(conn: Connection, stored: Sequence[RequestRecord]) -> None:
    """Insert unseen (role, model, version) rows and a deployment event for each."""
    first: dict[tuple[str, str, str], RequestRecord] = {}
    for rec in stored:
        seen = []
        if rec.target_version:
            seen.append(("target", rec.target_model, rec.target_version))
        if rec.draft_version:
            seen.append(("draft", rec.draft_model or rec.drafter, rec.draft_version))
        for key in seen:
            if key not in first or rec.ts_start < first[key].ts_start:
                first[key] = rec
    for (role, model, version), rec in sorted(first.items()):
        ts = rec.ts_start
        new_id = conn.execute(
            _insert(conn, VERSIONS)
            .on_conflict_do_nothing(index_elements=["role", "model", "version"])
            .values(role=role, model=model, version=version, first_seen=ts)
            .returning(VERSIONS.c.id)
        ).scalar()
        if new_id is None:
            continue
        others = conn.execute(
            select(func.count())
            .select_from(VERSIONS)
            .where(VERSIONS.c.role == role, VERSIONS.c.model == model, VERSIONS.c.id != new_id)
        ).scalar_one()
        conn.execute(
            EVENTS.insert().values(
                ts=ts,
                kind="version_changed" if others else "first_seen",
                role=role,
                model=model,
                version=version,
                model_version_id=new_id,
                workload=rec.workload,
                note=None,
            )
        )
