"""Between :class:`decoder.record.RequestRecord` and the ``requests`` table: validation and conversion.

The record's own :meth:`~decoder.record.RequestRecord.check` is the contract; :func:`validate` adds
what storing it needs on top (no NUL characters, which PostgreSQL refuses in text; bounded strings
and counts; timezone-aware timestamps), so that a record the recorder accepted can never fail later
in the database and block a batch.
"""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime
from typing import Any, Final

from decoder.record import MEASURE_FIELDS, RecordError, RequestRecord, quick_pass

RECORD_FIELDS: Final = tuple(f.name for f in fields(RequestRecord))
# Column order of the tuples from to_row: the record's fields in declaration order, then ingested_at.
ROW_COLUMNS: Final = (*RECORD_FIELDS, "ingested_at")
_HEAD: Final = RECORD_FIELDS[: RECORD_FIELDS.index("ts_start")]
_TAIL: Final = RECORD_FIELDS[RECORD_FIELDS.index("ts_end") + 1 :]
TEXT_FIELDS: Final = (
    "request_id",
    "workload",
    "target_model",
    "drafter",
    "draft_model",
    "target_version",
    "draft_version",
    "mode",
    "finish_reason",
    "error",
    "source",
    "prompt_hash",
)
MAX_TEXT: Final = 512
MAX_ERROR_TEXT: Final = 8192
# Beyond any real draft length; keeps the per-position arrays and histogram rows bounded.
MAX_SPECULATIVE_TOKENS: Final = 1024
# Counts stay exact in JSON and in PostgreSQL BIGINT sums.
MAX_COUNT: Final = 2**53


def validate(rec: object) -> RequestRecord:
    """Return ``rec`` if it is a storable record, else raise :class:`RecordError` naming the field.

    >>> from datetime import datetime, UTC
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> validate(RequestRecord("r1", t, t, "chat", "m", "none", source="api", mode="plain")).request_id
    'r1'
    >>> validate(RequestRecord("r1", t, t, "chat", "m\\x00", "none"))
    Traceback (most recent call last):
    ...
    decoder.record.RecordError: target_model: must not contain NUL characters
    """
    if type(rec) is RequestRecord:  # the common case, in one pass
        try:
            if quick_pass(rec) and _fits(rec):
                return rec
        except Exception:  # an odd value: the tests one by one say what is wrong with it
            pass
    return validate_rules(rec)


def validate_rules(rec: object) -> RequestRecord:
    """:func:`validate`'s tests one by one, in order: what finds the field of a record that fails the quick pass."""
    if not isinstance(rec, RequestRecord):
        raise RecordError("record", f"expected a RequestRecord, got {type(rec).__name__}")
    for name in ("ts_start", "ts_end"):
        value = getattr(rec, name)
        if not isinstance(value, datetime):
            raise RecordError(name, f"must be a datetime, got {value!r}")
    for name in ("workload", "request_id", "target_model", "drafter", "source"):
        if not isinstance(getattr(rec, name), str):
            raise RecordError(name, f"must be a string, got {getattr(rec, name)!r}")
    for name in ("accepted_per_position", "acceptance_histogram"):
        if not isinstance(getattr(rec, name), list):
            raise RecordError(name, f"must be a list, got {getattr(rec, name)!r}")
    for name in ("drafted_by_span", "accepted_by_span"):
        if getattr(rec, name) is not None and not isinstance(getattr(rec, name), list):
            raise RecordError(name, f"must be a list or null, got {getattr(rec, name)!r}")
    for name in MEASURE_FIELDS:
        value = getattr(rec, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise RecordError(name, f"must be a number, got {value!r}")
    try:
        rec.check()
    except TypeError as error:  # e.g. comparing an aware with a naive timestamp
        raise RecordError("ts_end", str(error)) from None
    for name in TEXT_FIELDS:
        value = getattr(rec, name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise RecordError(name, f"must be a string, got {value!r}")
        if "\x00" in value:
            raise RecordError(name, "must not contain NUL characters")
        limit = MAX_ERROR_TEXT if name == "error" else MAX_TEXT
        if len(value) > limit:
            raise RecordError(name, f"is {len(value)} characters long, more than {limit}")
    if rec.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
        raise RecordError("num_speculative_tokens", f"{rec.num_speculative_tokens} exceeds {MAX_SPECULATIVE_TOKENS}")
    for name in ("prompt_tokens", "output_tokens", "num_spec_steps", "num_draft_tokens"):
        if getattr(rec, name) > MAX_COUNT:
            raise RecordError(name, f"{getattr(rec, name)} exceeds {MAX_COUNT}")
    if not isinstance(rec.stopped_mid_step, bool):
        raise RecordError("stopped_mid_step", f"must be a bool, got {rec.stopped_mid_step!r}")
    return rec


def _fits(rec: RequestRecord) -> bool:
    """Given :func:`~decoder.record.quick_pass`, True only if :func:`validate`'s own tests pass too.

    quick_pass has already seen the types (plain datetimes, floats, ints, lists), NUL-free texts, a
    request id of at most 128 characters and a workload of at most 64; what is left is the store's.
    """
    target_model, drafter, source = rec.target_model, rec.drafter, rec.source
    if target_model is None or drafter is None or source is None:
        return False
    if len(target_model) > MAX_TEXT or len(drafter) > MAX_TEXT or len(source) > MAX_TEXT:
        return False
    text = rec.draft_model
    if text is not None and len(text) > MAX_TEXT:
        return False
    text = rec.target_version
    if text is not None and len(text) > MAX_TEXT:
        return False
    text = rec.draft_version
    if text is not None and len(text) > MAX_TEXT:
        return False
    text = rec.prompt_hash
    if text is not None and len(text) > MAX_TEXT:
        return False
    text = rec.error
    if text is not None and len(text) > MAX_ERROR_TEXT:
        return False
    if type(rec.mode) is not str or type(rec.finish_reason) is not str or type(rec.stopped_mid_step) is not bool:
        return False
    if rec.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
        return False
    return (
        rec.prompt_tokens <= MAX_COUNT
        and rec.output_tokens <= MAX_COUNT
        and rec.num_spec_steps <= MAX_COUNT
        and rec.num_draft_tokens <= MAX_COUNT
    )


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
