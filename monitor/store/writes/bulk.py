"""Fast multi-row writes for the recorder, per dialect, inside the caller's transaction.

``requests`` rows are the hot path (tens of thousands a second):

* PostgreSQL: ``COPY`` (text format, built here) into a session-local staging table, then one
  ``INSERT INTO requests SELECT ... ON CONFLICT DO NOTHING RETURNING request_id``, which tells
  exactly which rows were new even with other processes inserting at the same time. The conflict
  has no target, so that it holds on both layouts: the unique key is ``(request_id, ts_start)`` on
  the partitioned table (migration 0014; a replayed record has the same start, so it is still
  stored once) and ``request_id`` on a table ``draftwatch db partition`` has not converted yet, and
  a writer's statement stays valid across that conversion's swap.
* SQLite: the caller's transaction already holds SQLite's single write lock (the batch marker was
  written first), so the ids that already exist are read with one ``SELECT``, and the rows go in
  with one prepared ``INSERT ... ON CONFLICT DO NOTHING`` executed for all rows by the driver.

Rollup upserts are few rows per batch and use one ``INSERT ... SELECT FROM <json array> ON
CONFLICT DO UPDATE`` statement on both dialects.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import Table
from sqlalchemy.engine import Connection

from decoder.record import RequestRecord
from monitor.store.writes.rows import ROW_COLUMNS

_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def insert_requests(conn: Connection, records: Sequence[RequestRecord], ingested_at: datetime) -> set[str]:
    """Insert validated records into ``requests``; returns the ids actually stored (new ones)."""
    if not records:
        return set()
    if conn.dialect.name == "postgresql":
        return _insert_requests_postgresql(conn, records, ingested_at)
    if conn.dialect.name == "sqlite":
        return _insert_requests_sqlite(conn, records, ingested_at)
    raise ValueError(f"unsupported dialect {conn.dialect.name}")


def _insert_requests_postgresql(conn: Connection, records: Sequence[RequestRecord], ingested_at: datetime) -> set[str]:
    columns = ", ".join(ROW_COLUMNS)
    # Named after the column list, so a session that outlives a migration never reuses a stale shape.
    stage = f"dw_stage_requests_{zlib.crc32(columns.encode()):08x}"
    conn.exec_driver_sql(
        f"CREATE TEMP TABLE IF NOT EXISTS {stage} ON COMMIT DELETE ROWS AS SELECT {columns} FROM requests WITH NO DATA"
    )
    raw = conn.connection.driver_connection
    assert raw is not None
    ingested = ingested_at.isoformat()
    with raw.cursor() as cursor, cursor.copy(f"COPY {stage} ({columns}) FROM STDIN") as copy:
        copy.write("".join([copy_line(rec, ingested) for rec in records]))
    result = conn.exec_driver_sql(
        f"INSERT INTO requests ({columns}) SELECT {columns} FROM {stage} ON CONFLICT DO NOTHING RETURNING request_id"
    )
    stored = {r[0] for r in result}
    conn.exec_driver_sql(f"DELETE FROM {stage}")  # the next batch may share this transaction
    return stored


def _text(value: str | None) -> str:
    if value is None:
        return "\\N"
    return value.translate(_COPY_ESCAPES)


def _number(value: float | None) -> str:
    return "\\N" if value is None else repr(value)


def _ints(values: list[int]) -> str:
    # Validated lists of non-negative ints: cheaper than json.dumps and the same text.
    return "[" + ",".join(map(str, values)) + "]"


def _spans(values: list[int] | None) -> str | None:
    # NULL, not a JSON null: the column is NULL where the source does not know output positions.
    return None if values is None else _ints(values)


def _utc(value: datetime) -> datetime:
    tz = value.tzinfo
    if tz is UTC:  # the common case, and the cheap one
        return value
    return value.replace(tzinfo=UTC) if tz is None else value.astimezone(UTC)


def copy_line(rec: RequestRecord, ingested: str) -> str:
    """One line of PostgreSQL COPY text for a record, in :data:`ROW_COLUMNS` order."""
    return (
        "\t".join(
            (
                _text(rec.request_id),
                _utc(rec.ts_start).isoformat(),
                _utc(rec.ts_end).isoformat(),
                _text(rec.workload),
                _text(rec.target_model),
                _text(rec.drafter),
                _text(rec.draft_model),
                _text(rec.target_version),
                _text(rec.draft_version),
                rec.mode,
                str(rec.num_speculative_tokens),
                str(rec.prompt_tokens),
                str(rec.output_tokens),
                str(rec.num_spec_steps),
                str(rec.num_draft_tokens),
                str(rec.num_accepted_tokens),
                _ints(rec.accepted_per_position),
                _ints(rec.acceptance_histogram),
                _number(rec.ttft_ms),
                _number(rec.latency_ms),
                _number(rec.draft_ms),
                _number(rec.verify_ms),
                repr(float(rec.temperature)),
                repr(float(rec.top_p)),
                rec.finish_reason,
                _text(rec.error),
                _text(rec.source),
                _text(rec.prompt_hash),
                "t" if rec.stopped_mid_step else "f",
                _text(rec.holdout_reason),
                _text(_spans(rec.drafted_by_span)),
                _text(_spans(rec.accepted_by_span)),
                _number(rec.decode_ms),
                _text(None if rec.upstream_inflight is None else str(rec.upstream_inflight)),
                "t" if rec.mode_inferred else "f",
                _text(rec.replica),
                _text(None if rec.cached_prompt_tokens is None else str(rec.cached_prompt_tokens)),
                _text(rec.style_hash),
                _number(rec.prompt_copy_share),
                _text(rec.engine_version),
                _number(rec.replica_uptime_s),
                _text(rec.uptime_from),
                _number(rec.kv_cache_use),
                ingested,
            )
        )
        + "\n"
    )


def _insert_requests_sqlite(conn: Connection, records: Sequence[RequestRecord], ingested_at: datetime) -> set[str]:
    ids = [rec.request_id for rec in records]
    existing: set[str] = set()
    # Stay under SQLite's bound-parameter limit (32766 since 3.32) for big batches.
    for start in range(0, len(ids), 10_000):
        chunk = ids[start : start + 10_000]
        marks = ",".join("?" * len(chunk))
        result = conn.exec_driver_sql(f"SELECT request_id FROM requests WHERE request_id IN ({marks})", tuple(chunk))
        existing.update(r[0] for r in result)
    ingested = sqlite_time(ingested_at)
    fresh = [sqlite_row(rec, ingested) for rec in records if rec.request_id not in existing]
    if fresh:
        marks = ",".join("?" * len(ROW_COLUMNS))
        conn.exec_driver_sql(
            f"INSERT INTO requests ({', '.join(ROW_COLUMNS)}) VALUES ({marks}) ON CONFLICT (request_id) DO NOTHING",
            fresh,
        )
    return {rec.request_id for rec in records if rec.request_id not in existing}


def sqlite_time(value: datetime) -> str:
    """SQLAlchemy's own SQLite DateTime text format (naive UTC), so reads and comparisons agree."""
    return _utc(value).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def sqlite_row(rec: RequestRecord, ingested: str) -> tuple[Any, ...]:
    """A record as SQLite parameters, in :data:`ROW_COLUMNS` order."""
    return (
        rec.request_id,
        sqlite_time(rec.ts_start),
        sqlite_time(rec.ts_end),
        rec.workload,
        rec.target_model,
        rec.drafter,
        rec.draft_model,
        rec.target_version,
        rec.draft_version,
        rec.mode,
        rec.num_speculative_tokens,
        rec.prompt_tokens,
        rec.output_tokens,
        rec.num_spec_steps,
        rec.num_draft_tokens,
        rec.num_accepted_tokens,
        _ints(rec.accepted_per_position),
        _ints(rec.acceptance_histogram),
        rec.ttft_ms,
        rec.latency_ms,
        rec.draft_ms,
        rec.verify_ms,
        rec.temperature,
        rec.top_p,
        rec.finish_reason,
        rec.error,
        rec.source,
        rec.prompt_hash,
        int(rec.stopped_mid_step),
        rec.holdout_reason,
        _spans(rec.drafted_by_span),
        _spans(rec.accepted_by_span),
        rec.decode_ms,
        rec.upstream_inflight,
        int(rec.mode_inferred),
        rec.replica,
        rec.cached_prompt_tokens,
        rec.style_hash,
        rec.prompt_copy_share,
        rec.engine_version,
        rec.replica_uptime_s,
        rec.uptime_from,
        rec.kv_cache_use,
        ingested,
    )


def upsert_add(
    conn: Connection, table: Table, rows: Sequence[dict[str, Any]], *, conflict: Sequence[str], add: Sequence[str]
) -> None:
    """Insert ``rows``; where the ``conflict`` columns exist already, add the ``add`` columns into them."""
    _json_insert(conn, table, rows, conflict, add, None)


def insert_returning(
    conn: Connection, table: Table, rows: Sequence[dict[str, Any]], *, conflict: Sequence[str], returning: str
) -> list[Any]:
    """Insert ``rows``, skipping conflicts; returns the ``returning`` column of the rows inserted."""
    return _json_insert(conn, table, rows, conflict, (), returning)


def _json_insert(
    conn: Connection,
    table: Table,
    rows: Sequence[dict[str, Any]],
    conflict: Sequence[str],
    add: Sequence[str],
    returning: str | None,
) -> list[Any]:
    if not rows:
        return []
    columns = tuple(rows[0])
    sql = _json_statement(conn.dialect.name, table, columns, tuple(conflict), tuple(add), returning)
    to_text = sqlite_time if conn.dialect.name == "sqlite" else datetime.isoformat
    payload = json.dumps(
        [{k: to_text(v) if isinstance(v, datetime) else v for k, v in row.items()} for row in rows],
        separators=(",", ":"),
    )
    result = conn.exec_driver_sql(sql, (payload,))
    return [r[0] for r in result] if returning else []


@lru_cache(maxsize=32)
def _json_statement(
    dialect_name: str,
    table: Table,
    columns: tuple[str, ...],
    conflict: tuple[str, ...],
    add: tuple[str, ...],
    returning: str | None,
) -> str:
    column_list = ", ".join(columns)
    if dialect_name == "postgresql":
        from sqlalchemy.dialects import postgresql

        dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
        typed = ", ".join(f"{c} {table.c[c].type.compile(dialect=dialect)}" for c in columns)
        source = f"SELECT {column_list} FROM json_to_recordset(%s::json) AS x({typed})"
    elif dialect_name == "sqlite":
        extracts = ", ".join(f"json_extract(value, '$.{c}')" for c in columns)
        # "WHERE true" resolves SQLite's parsing ambiguity between a join's ON and ON CONFLICT.
        source = f"SELECT {extracts} FROM json_each(?) WHERE true"
    else:
        raise ValueError(f"unsupported dialect {dialect_name}")
    if add:
        action = "DO UPDATE SET " + ", ".join(f"{c} = {table.name}.{c} + excluded.{c}" for c in add)
    else:
        action = "DO NOTHING"
    sql = f"INSERT INTO {table.name} ({column_list}) {source} ON CONFLICT ({', '.join(conflict)}) {action}"
    return sql + (f" RETURNING {returning}" if returning else "")
