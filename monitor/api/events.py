"""The record as the API accepts it: field-level validation, consistency checks, all-or-nothing batches.

:class:`EventIn` mirrors :class:`decoder.record.RequestRecord` with bounds that a database write can
never trip over (finite numbers, bounded strings and arrays, no NUL or unpaired surrogates,
plausible timestamps); :func:`to_record` then applies the record's own contract (accepted <=
drafted, array sums and lengths) through :func:`monitor.store.rows.validate`. A batch is parsed in
full before anything is stored, so one bad record rejects the whole batch.

>>> batch = parse_events({"request_id": "r1", "ts_start": "2026-01-01T00:00:00Z",
...     "ts_end": "2026-01-01T00:00:01Z", "workload": "chat", "target_model": "m", "drafter": "none"}, 10)
>>> batch[0].source, batch[0].ts_end.isoformat()
('api', '2026-01-01T00:00:01+00:00')
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from decoder.holdout import HoldoutReason
from decoder.record import OUTPUT_SPANS, WORKLOAD_PATTERN, Mode, RecordError, RequestRecord
from monitor.api.errors import ApiError, Loc, Problem, problems_of, validation_error
from monitor.store.rows import MAX_COUNT, MAX_ERROR_TEXT, MAX_SPECULATIVE_TOKENS, MAX_TEXT

# A record may be stamped a little ahead of this server's clock (skewed clients); beyond this it is junk.
MAX_FUTURE: Final = timedelta(minutes=10)
EARLIEST: Final = datetime(2000, 1, 1, tzinfo=UTC)
# Timings above ~116 days are not request timings; bounding them also keeps rollup sums finite.
MAX_MS: Final = 1e10
MAX_TEMPERATURE: Final = 100.0


def _clean_text(value: str) -> str:
    # PostgreSQL refuses NUL in text and unpaired surrogates cannot be encoded as UTF-8: both would
    # fail a batch at commit time, after the 202 promise, so they are refused here.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no unpaired surrogates)") from None
    return value


def _plausible_time(value: datetime) -> datetime:
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    # Both bounds are checked before converting: a time past the calendar in UTC
    # (9999-12-31T23:00-05:00) cannot be converted, and comparing needs no conversion.
    if value < EARLIEST:
        raise ValueError(f"must not be before {EARLIEST.date().isoformat()}")
    if value > datetime.now(UTC) + MAX_FUTURE:
        raise ValueError(f"is more than {int(MAX_FUTURE.total_seconds() // 60)} minutes in the future")
    return value.astimezone(UTC)


Text = Annotated[str, AfterValidator(_clean_text)]
ShortText = Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_clean_text)]


def _clean_optional(value: str | None) -> str | None:
    return None if value is None else _clean_text(value)


OptionalText = Annotated[str | None, Field(max_length=MAX_TEXT), AfterValidator(_clean_optional)]
Count = Annotated[StrictInt, Field(ge=0, le=MAX_COUNT)]
Millis = Annotated[float | None, Field(ge=0, le=MAX_MS, allow_inf_nan=False)]
Timestamp = Annotated[datetime, AfterValidator(_plausible_time)]
Workload = Annotated[str, Field(min_length=1, max_length=64, pattern=WORKLOAD_PATTERN.pattern)]
FinishReason = Literal["stop", "length", "error"]
# Per output span (decoder.record.OUTPUT_SPAN_EDGES); null when the sender does not know positions.
SpanCounts = Annotated[list[Count], Field(min_length=OUTPUT_SPANS, max_length=OUTPUT_SPANS)] | None


class EventIn(BaseModel):
    """One finished request (the record of docs/api.md); unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: Annotated[str, Field(min_length=1, max_length=128), AfterValidator(_clean_text)]
    ts_start: Timestamp
    ts_end: Timestamp
    workload: Workload
    target_model: ShortText
    drafter: ShortText
    draft_model: OptionalText = None
    target_version: OptionalText = None
    draft_version: OptionalText = None
    mode: Mode = "speculative"
    num_speculative_tokens: Annotated[StrictInt, Field(ge=0, le=MAX_SPECULATIVE_TOKENS)] = 0
    prompt_tokens: Count = 0
    output_tokens: Count = 0
    num_spec_steps: Count = 0
    num_draft_tokens: Count = 0
    num_accepted_tokens: Count = 0
    accepted_per_position: Annotated[list[Count], Field(max_length=MAX_SPECULATIVE_TOKENS)] = []
    acceptance_histogram: Annotated[list[Count], Field(max_length=MAX_SPECULATIVE_TOKENS + 1)] = []
    ttft_ms: Millis = None
    latency_ms: Millis = None
    draft_ms: Millis = None
    verify_ms: Millis = None
    temperature: Annotated[float, Field(ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)] = 0.0
    top_p: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 1.0
    finish_reason: FinishReason = "stop"
    error: Annotated[str | None, Field(max_length=MAX_ERROR_TEXT), AfterValidator(_clean_optional)] = None
    source: Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_clean_text)] = "api"
    prompt_hash: Annotated[str | None, Field(max_length=128), AfterValidator(_clean_optional)] = None
    stopped_mid_step: StrictBool = False
    holdout_reason: HoldoutReason | None = None
    drafted_by_span: SpanCounts = None
    accepted_by_span: SpanCounts = None
    decode_ms: Millis = None
    upstream_inflight: Annotated[StrictInt, Field(ge=1, le=MAX_COUNT)] | None = None


class EventBatchIn(BaseModel):
    """A batch: all records are stored, or none."""

    model_config = ConfigDict(extra="forbid")

    events: list[EventIn]


_FIELDS: Final = tuple(EventIn.model_fields)


def to_record(event: EventIn, loc: Loc = ()) -> RequestRecord:
    """The record of a validated event, after the record's own consistency checks (accepted <= drafted, ...)."""
    # The event's attributes are exactly the record's fields; the event is dropped afterwards, so
    # the record may keep its lists.
    record = RequestRecord(**event.__dict__)
    try:
        return record.check()
    except RecordError as error:
        message = str(error).split(": ", 1)[-1]
        raise validation_error([Problem(loc=[*loc, error.field], msg=message, type="record_contract")]) from None


def parse_body(body: bytes, max_batch: int) -> list[RequestRecord]:
    """Records of a raw ``POST /v1/events`` body; raises :class:`ApiError` (400 or 422).

    A well-formed batch takes the fast path (pydantic parses and validates the JSON in one pass);
    anything it refuses is parsed again on the slow path, which words every problem precisely.
    """
    if body.lstrip()[:10].startswith(b'{"events"'):
        try:
            batch = EventBatchIn.model_validate_json(body)
        except ValidationError:
            pass
        else:
            if len(batch.events) <= max_batch:
                return _records(batch.events)
    return parse_events(loads(body), max_batch)


def _records(events: list[EventIn]) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    problems: list[Problem] = []
    for index, event in enumerate(events):
        try:
            records.append(to_record(event, ("body", "events", index)))
        except ApiError as error:
            problems.extend(error.detail or [])
            if len(problems) >= 50:
                break
    if problems:
        raise validation_error(problems[:50], "batch")
    return records


def loads(body: bytes) -> Any:
    """Parse a JSON body; 400 for anything that is not JSON (NaN and Infinity are not JSON)."""

    def reject_constant(name: str) -> Any:
        raise ValueError(f"{name} is not valid JSON")

    try:
        return json.loads(body, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        # RecursionError: a hostile, deeply nested document; still just bad JSON to the client.
        raise ApiError(400, "invalid_json", "the body is not valid JSON") from None


def parse_events(body: Any, max_batch: int) -> list[RequestRecord]:
    """Records of a single-record body or an ``{"events": [...]}`` batch; raises :class:`ApiError`."""
    if not isinstance(body, dict):
        raise validation_error(
            [Problem(loc=["body"], msg='expected a record object or {"events": [...]}', type="type_error")]
        )
    if "events" not in body:
        return [_parse_one(body, ("body",))]
    if set(body) != {"events"} or not isinstance(body["events"], list):
        raise validation_error(
            [
                Problem(
                    loc=["body", "events"], msg="a batch is an object with one key, events: a list", type="type_error"
                )
            ]
        )
    items = body["events"]
    if len(items) > max_batch:
        raise validation_error(
            [
                Problem(
                    loc=["body", "events"],
                    msg=f"at most {max_batch} events per batch, got {len(items)}",
                    type="too_long",
                )
            ]
        )
    problems: list[Problem] = []
    records: list[RequestRecord] = []
    for index, item in enumerate(items):
        try:
            records.append(_parse_one(item, ("body", "events", index)))
        except ApiError as error:
            problems.extend(error.detail or [])
            if len(problems) >= 50:  # enough to fix a client; a hostile batch gets no more work
                break
    if problems:
        raise validation_error(problems[:50], "batch")
    return records


def _parse_one(item: Any, loc: Loc) -> RequestRecord:
    try:
        event = EventIn.model_validate(item)
    except ValidationError as error:
        raise validation_error(problems_of(error, loc)) from None
    return to_record(event, loc)
