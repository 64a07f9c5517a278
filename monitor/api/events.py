"""The record as the API accepts it: field-level validation, consistency checks, all-or-nothing batches.

:class:`EventIn` mirrors :class:`decoder.record.RequestRecord`, each field's bounds taken from the
record's one declaration (:data:`decoder.record.LIMITS`) so that pydantic refuses a bad field with
its own wording before anything else runs; :func:`to_record` then applies the record's own contract
(accepted <= drafted, array sums and lengths). What is the wire's alone is the clock: a client's
timestamps must be plausible against this server's. A batch is parsed in full before anything is
stored, so one bad record rejects the whole batch.

>>> batch = parse_events({"request_id": "r1", "ts_start": "2026-01-01T00:00:00Z",
...     "ts_end": "2026-01-01T00:00:01Z", "workload": "chat", "target_model": "m", "drafter": "none"}, 10)
>>> batch[0].source, batch[0].ts_end.isoformat()
('api', '2026-01-01T00:00:01+00:00')
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar, Union, get_args, get_origin, get_type_hints

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, create_model
from pydantic.fields import FieldInfo

from decoder.record import COUNT, LIMITS, Limit, RecordError, RequestRecord, clean_text
from monitor.api.errors import ApiError, Loc, Problem, problems_of, validation_error

# A record may be stamped a little ahead of this server's clock (skewed clients); beyond this it is junk.
MAX_FUTURE: Final = timedelta(minutes=10)
EARLIEST: Final = datetime(2000, 1, 1, tzinfo=UTC)
MAX_PROBLEMS: Final = 50

T = TypeVar("T")


def bounds(limit: Limit) -> FieldInfo:
    """The pydantic constraints of a record field's :class:`~decoder.record.Limit`, passed on as declared."""
    declared: dict[str, Any] = {name: value for name, value in asdict(limit).items() if value is not None}
    field: FieldInfo = Field(**declared)
    return field


def _clean_optional(value: str | None) -> str | None:
    return None if value is None else clean_text(value)


def _plausible_time(value: datetime) -> datetime:
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    # Both bounds are checked before converting: a time past the calendar in UTC
    # (9999-12-31T23:00-05:00) cannot be converted, and comparing needs no conversion.
    if value < EARLIEST:
        raise ValueError(f"must not be before {EARLIEST.date().isoformat()}")
    if value > datetime.now(UTC) + MAX_FUTURE:
        raise ValueError(f"is more than {int(MAX_FUTURE.total_seconds() // 60)} minutes in the future")
    return value.astimezone(UTC)


# The field types both wire schemas share (the adapters' caller fields are a subset of the record's).
RequestId = Annotated[str, bounds(LIMITS["request_id"]), AfterValidator(clean_text)]
Workload = Annotated[str, bounds(LIMITS["workload"])]
ShortText = Annotated[str, bounds(LIMITS["target_model"]), AfterValidator(clean_text)]
OptionalText = Annotated[str | None, bounds(LIMITS["draft_model"]), AfterValidator(_clean_optional)]
PromptHash = Annotated[str | None, bounds(LIMITS["prompt_hash"]), AfterValidator(_clean_optional)]
Gamma = Annotated[StrictInt, bounds(LIMITS["num_speculative_tokens"])]
Temperature = Annotated[float, bounds(LIMITS["temperature"])]
TopP = Annotated[float, bounds(LIMITS["top_p"])]
Timestamp = Annotated[datetime, AfterValidator(_plausible_time)]
Millis = Annotated[float, bounds(LIMITS["ttft_ms"])]
# What a record's field defaults to when a client leaves it out; the source says who sent it.
_WIRE_DEFAULTS: Final = {"source": "api"}


def _wire_type(name: str, hint: Any) -> Any:
    """The wire's type of record field ``name``: its type in the record, strict (no "3" for 3), bounded by
    :data:`~decoder.record.LIMITS` and its texts cleaned; a field of a type without limits has none."""
    optional = get_origin(hint) in (Union, UnionType) and type(None) in get_args(hint)
    base = next(arg for arg in get_args(hint) if arg is not type(None)) if optional else hint
    if base is datetime:
        wire: Any = Timestamp
    elif base is bool:
        wire = StrictBool
    elif base is str:
        wire = Annotated[str, bounds(LIMITS[name]), AfterValidator(clean_text)]
    elif base is int:
        wire = Annotated[StrictInt, bounds(LIMITS[name])]
    elif base is float:
        wire = Annotated[float, bounds(LIMITS[name])]
    elif get_origin(base) is list:
        wire = Annotated[list[Annotated[StrictInt, bounds(COUNT)]], bounds(LIMITS[name])]
    else:  # a Literal: its choices are the rule
        wire = base
    return wire | None if optional else wire


def _wire_default(spec: dataclasses.Field[Any]) -> Any:
    if spec.name in _WIRE_DEFAULTS:
        return _WIRE_DEFAULTS[spec.name]
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return ... if spec.default is dataclasses.MISSING else spec.default


class _Event(BaseModel):
    """One finished request (the record of docs/api.md); unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


if TYPE_CHECKING:
    EventIn = _Event
else:
    # The record's fields, each as _wire_type makes it: a field added to RequestRecord is on the wire
    # with its limits, and one of a new type fails here, at import, until _wire_type knows it.
    _HINTS: Final = get_type_hints(RequestRecord)
    EventIn = create_model(
        "EventIn",
        __base__=_Event,
        __doc__=_Event.__doc__,
        __module__=__name__,
        **{f.name: (_wire_type(f.name, _HINTS[f.name]), _wire_default(f)) for f in dataclasses.fields(RequestRecord)},
    )


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
                return all_or_nothing(_in_batch(batch.events), to_record)
    return parse_events(loads(body), max_batch)


def all_or_nothing(
    located: Iterable[tuple[T, Loc]], build: Callable[[T, Loc], RequestRecord], what: str = "batch"
) -> list[RequestRecord]:
    """Each item's record (``build`` at the item's ``loc``), or one 422 with the problems of the items that failed.

    At most 50 problems: enough to fix a client, and a hostile batch gets no more work.
    """
    records: list[RequestRecord] = []
    problems: list[Problem] = []
    for item, loc in located:
        try:
            records.append(build(item, loc))
        except ApiError as error:
            problems.extend(error.detail or [])
            if len(problems) >= MAX_PROBLEMS:
                break
    if problems:
        raise validation_error(problems[:MAX_PROBLEMS], what)
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
        return [record_from(body, ("body",))]
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
    return all_or_nothing(_in_batch(items), record_from)


def _in_batch(items: list[T]) -> Iterator[tuple[T, Loc]]:
    return ((item, ("body", "events", index)) for index, item in enumerate(items))


def record_from(values: Any, loc: Loc = ("body",)) -> RequestRecord:
    """The record of one posted object (or of the fields an adapter or the proxy gathered): the wire's field
    checks, then the record's contract; raises :class:`ApiError` (422) naming each field at fault under ``loc``."""
    try:
        event = EventIn.model_validate(values)
    except ValidationError as error:
        raise validation_error(problems_of(error, loc)) from None
    return to_record(event, loc)
