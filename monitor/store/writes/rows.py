"""Between :class:`decoder.record.RequestRecord` and the ``requests`` table: the columns, and back.

The record's own :meth:`~decoder.record.RequestRecord.check` is the whole contract, the store's
bounds included (no NUL or lone surrogate, which PostgreSQL and UTF-8 refuse; bounded texts and
counts), so that a record the recorder accepted can never fail later in the database and block
a batch: nothing here checks a record again.
"""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime
from typing import Any, Final

from decoder.record import RecordError, RequestRecord

RECORD_FIELDS: Final = tuple(f.name for f in fields(RequestRecord))
# Column order of the tuples from to_row: the record's fields in declaration order, then ingested_at.
ROW_COLUMNS: Final = (*RECORD_FIELDS, "ingested_at")
_HEAD: Final = RECORD_FIELDS[: RECORD_FIELDS.index("ts_start")]
_TAIL: Final = RECORD_FIELDS[RECORD_FIELDS.index("ts_end") + 1 :]


def validate(rec: object) -> RequestRecord:
    """Return ``rec`` if it is a record that keeps the contract, else raise :class:`RecordError` naming the field.

    The recorder's callers hand it anything; only a :class:`RequestRecord` is checked further.

    >>> from datetime import datetime, UTC
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> validate(RequestRecord("r1", t, t, "chat", "m", "none", source="api", mode="plain")).request_id
    'r1'
    >>> validate(RequestRecord("r1", t, t, "chat", "m\\x00", "none"))
    Traceback (most recent call last):
    ...
    decoder.record.RecordError: target_model: must not contain NUL characters
    """
    if not isinstance(rec, RequestRecord):
        raise RecordError("record", f"expected a RequestRecord, got {type(rec).__name__}")
    return rec.check()


def to_row(rec: RequestRecord, ingested_at: datetime) -> tuple[Any, ...]:
    """The ``requests`` row of a validated record, in :data:`ROW_COLUMNS` order, timestamps in UTC."""
    return (
        *[getattr(rec, name) for name in _HEAD],
        _utc(rec.ts_start),
        _utc(rec.ts_end),
        *[getattr(rec, name) for name in _TAIL],
        ingested_at,
    )


def from_row(row: Any) -> RequestRecord:
    """A record from a ``requests`` row (an ORM object or a Row with the record's columns)."""
    mapping = row._mapping if hasattr(row, "_mapping") else {n: getattr(row, n) for n in RECORD_FIELDS}
    values = {name: mapping[name] for name in RECORD_FIELDS}
    values["accepted_per_position"] = list(values["accepted_per_position"] or [])
    values["acceptance_histogram"] = list(values["acceptance_histogram"] or [])
    for name in ("drafted_by_span", "accepted_by_span"):
        values[name] = None if values[name] is None else list(values[name])
    return RequestRecord(**values)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
