"""Per-request speculative-decoding figures of external serving stacks, mapped onto the record.

Each adapter takes the stack's own response object (or the part of it named below) plus a few
draftwatch fields the stack cannot know (``workload``, and optionally ``request_id``, timestamps,
``drafter``, model names and versions, sampling settings). Fields of the stack's response that are
not listed are ignored, generated text included: it is never stored. What a stack does not report
stays empty: nullable record fields are null, per-step arrays are empty, and counts the schema
holds as non-null (``num_spec_steps`` for llama.cpp) are 0, which the derived figures read as
"unknown" (no mean acceptance length without steps). docs/api.md maps every field.

The mapped record then passes the same validation as ``POST /v1/events`` (:mod:`monitor.api.events`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError
from pydantic.config import JsonDict

from decoder.record import Mode, RequestRecord
from monitor.api.errors import ApiError, Loc, Problem, problems_of, validation_error
from monitor.api.events import (
    Count,
    EventIn,
    Millis,
    OptionalText,
    ShortText,
    Timestamp,
    Workload,
    to_record,
)
from monitor.store.rows import MAX_SPECULATIVE_TOKENS

Stack = Literal["vllm", "llamacpp", "sglang"]
STACKS: Final[tuple[Stack, ...]] = ("vllm", "llamacpp", "sglang")
Counts = Annotated[list[Count], Field(max_length=MAX_SPECULATIVE_TOKENS + 1)]
Gamma = Annotated[StrictInt, Field(ge=0, le=MAX_SPECULATIVE_TOKENS)]
# Unix timestamps (seconds) from 2000 to 2100.
UnixSeconds = Annotated[float, Field(ge=946_684_800, le=4_102_444_800, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)]


class _Lenient(BaseModel):
    # The stacks' objects carry much more than is read here (and add fields between versions).
    model_config = ConfigDict(extra="ignore", frozen=True)


class AdapterFields(_Lenient):
    """What the caller adds to a stack's response."""

    workload: Workload
    request_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    ts_start: Timestamp | None = None
    ts_end: Timestamp | None = None
    target_model: ShortText | None = None
    drafter: ShortText = "unknown"
    draft_model: OptionalText = None
    target_version: OptionalText = None
    draft_version: OptionalText = None
    mode: Mode | None = None
    num_speculative_tokens: Gamma | None = None
    temperature: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 0.0
    top_p: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 1.0
    prompt_hash: Annotated[str, Field(max_length=128)] | None = None


def _one_of(*alternatives: JsonDict) -> JsonDict:
    return {"anyOf": list(alternatives)}


def _present(name: str) -> JsonDict:
    return {"required": [name]}


# The document states what map_response checks: an id and a model name, from the caller or the stack.
_IDENTIFIED: Final[JsonDict] = {
    "allOf": [_one_of(_present("request_id"), _present("id")), _one_of(_present("target_model"), _present("model"))]
}


class _Choice(_Lenient):
    finish_reason: Annotated[str, Field(max_length=64)] | None = None


class VllmSpecDecoding(_Lenient):
    num_spec_steps: Count | None = None
    num_draft_tokens: Count | None = None
    num_accepted_draft_tokens: Count | None = None
    num_spec_tokens: Gamma | None = None
    acceptance_histogram: Counts | None = None


class VllmMetrics(_Lenient):
    time_to_first_token_ms: Millis = None
    generation_time_ms: Millis = None
    queue_time_ms: Millis = None
    speculative_decoding: VllmSpecDecoding | None = None


class VllmUsage(_Lenient):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None


class VllmIn(AdapterFields):
    """A vLLM response (chat or completions) with ``metrics`` enabled, plus the draftwatch fields."""

    model_config = ConfigDict(json_schema_extra=_IDENTIFIED)

    id: Annotated[str, Field(max_length=128)] | None = None
    model: Annotated[str, Field(max_length=512)] | None = None
    usage: VllmUsage | None = None
    metrics: VllmMetrics | None = None
    choices: list[_Choice] = []


class LlamacppTimings(_Lenient):
    prompt_n: Count | None = None
    prompt_ms: Millis = None
    predicted_n: Count | None = None
    predicted_ms: Millis = None
    draft_n: Count | None = None
    draft_n_accepted: Count | None = None


class LlamacppIn(AdapterFields):
    """A llama.cpp server response (``/completion`` or its OpenAI-compatible endpoints), plus draftwatch fields."""

    model_config = ConfigDict(json_schema_extra=_IDENTIFIED)

    timings: LlamacppTimings
    id: Annotated[str, Field(max_length=128)] | None = None
    model: Annotated[str, Field(max_length=512)] | None = None
    stop_type: Annotated[str, Field(max_length=32)] | None = None
    choices: list[_Choice] = []


class SglangFinish(_Lenient):
    type: Annotated[str, Field(max_length=32)] | None = None


class SglangMetaInfo(_Lenient):
    id: Annotated[str, Field(max_length=128)] | None = None
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    finish_reason: SglangFinish | None = None
    e2e_latency: Seconds | None = None
    spec_verify_ct: Count | None = None
    spec_accept_token_num: Count | None = None
    spec_draft_token_num: Count | None = None
    spec_accept_histogram: Counts | None = None
    request_received_ts: UnixSeconds | None = None
    prefill_finished_ts: UnixSeconds | None = None
    decode_finished_ts: UnixSeconds | None = None


class SglangIn(AdapterFields):
    """An SGLang ``/generate`` response (its ``meta_info``), plus draftwatch fields; SGLang names no model."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                _one_of(_present("request_id"), {"properties": {"meta_info": _present("id")}}),
                _present("target_model"),
            ]
        }
    )

    meta_info: SglangMetaInfo


MODELS: Final[dict[Stack, type[AdapterFields]]] = {"vllm": VllmIn, "llamacpp": LlamacppIn, "sglang": SglangIn}
_FINISH: Final = {
    "stop": "stop",
    "eos": "stop",
    "word": "stop",
    "tool_calls": "stop",
    "length": "length",
    "limit": "length",
    "abort": "error",
    "error": "error",
}


def parse_adapter_events(stack: Stack, body: Any, max_batch: int) -> list[RequestRecord]:
    """Records of one stack response or ``{"events": [response, ...]}``; raises :class:`ApiError`."""
    if isinstance(body, dict) and set(body) == {"events"} and isinstance(body["events"], list):
        items: list[Any] = body["events"]
        if len(items) > max_batch:
            raise validation_error(
                [Problem(loc=["body", "events"], msg=f"at most {max_batch} events per batch", type="too_long")]
            )
        prefixes: list[Loc] = [("body", "events", i) for i in range(len(items))]
    else:
        items, prefixes = [body], [("body",)]
    records: list[RequestRecord] = []
    problems: list[Problem] = []
    for item, loc in zip(items, prefixes, strict=True):
        try:
            records.append(map_response(stack, item, loc))
        except ApiError as error:
            problems.extend(error.detail or [])
            if len(problems) >= 50:
                break
    if problems:
        raise validation_error(problems[:50], "batch" if len(items) > 1 else "request")
    return records


def map_response(stack: Stack, item: Any, loc: Loc = ("body",)) -> RequestRecord:
    if not isinstance(item, dict):
        raise validation_error([Problem(loc=list(loc), msg=f"expected a {stack} response object", type="type_error")])
    try:
        parsed = MODELS[stack].model_validate(item)
    except ValidationError as error:
        raise validation_error(problems_of(error, loc)) from None
    if isinstance(parsed, VllmIn):
        fields, response_id, model, latency_ms = _vllm(parsed)
    elif isinstance(parsed, LlamacppIn):
        fields, response_id, model, latency_ms = _llamacpp(parsed)
    else:
        assert isinstance(parsed, SglangIn)
        fields, response_id, model, latency_ms = _sglang(parsed)
    request_id = parsed.request_id or response_id
    target_model = parsed.target_model or model
    missing = [name for name, value in (("request_id", request_id), ("target_model", target_model)) if not value]
    if missing:
        raise validation_error(
            [
                Problem(loc=[*loc, name], msg=f"the {stack} response carries none: send {name}", type="missing")
                for name in missing
            ]
        )
    ts_end = parsed.ts_end or fields.pop("ts_end", None) or datetime.now(UTC)
    ts_start = parsed.ts_start or fields.pop("ts_start", None) or ts_end - timedelta(milliseconds=latency_ms or 0.0)
    fields.pop("ts_start", None)
    fields.pop("ts_end", None)
    gamma = parsed.num_speculative_tokens if parsed.num_speculative_tokens is not None else fields.pop("gamma", 0)
    fields.pop("gamma", None)
    histogram: list[int] = fields.pop("histogram", [])
    if histogram and gamma + 1 > len(histogram):
        histogram = histogram + [0] * (gamma + 1 - len(histogram))  # stacks that grow the histogram as needed
    record = {
        **fields,
        "request_id": request_id,
        "ts_start": ts_start,
        "ts_end": ts_end,
        "workload": parsed.workload,
        "target_model": target_model,
        "drafter": parsed.drafter,
        "draft_model": parsed.draft_model,
        "target_version": parsed.target_version,
        "draft_version": parsed.draft_version,
        "mode": parsed.mode or fields.get("mode", "speculative"),
        "num_speculative_tokens": gamma,
        "acceptance_histogram": histogram,
        "accepted_per_position": per_position(histogram, gamma),
        "temperature": parsed.temperature,
        "top_p": parsed.top_p,
        "prompt_hash": parsed.prompt_hash,
        "source": f"proxy:{stack}",
    }
    try:
        event = EventIn.model_validate(record)
    except ValidationError as error:
        raise validation_error(problems_of(error, loc)) from None
    return to_record(event, loc)


def per_position(histogram: list[int], gamma: int) -> list[int]:
    """Steps that accepted the draft at position i: those that accepted more than i (acceptance is a prefix).

    >>> per_position([39, 1, 0, 3], 3)
    [4, 3, 3]
    """
    if not histogram:
        return []
    return [sum(histogram[i + 1 :]) for i in range(min(gamma, len(histogram) - 1))]


def _finish(reason: str | None) -> str:
    return _FINISH.get(reason or "stop", "stop")


def _vllm(body: VllmIn) -> tuple[dict[str, Any], str | None, str | None, float | None]:
    metrics = body.metrics or VllmMetrics()
    spec = metrics.speculative_decoding
    usage = body.usage or VllmUsage()
    ttft, generation = metrics.time_to_first_token_ms, metrics.generation_time_ms
    latency = ttft + generation if ttft is not None and generation is not None else None
    fields: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens or 0,
        "output_tokens": usage.completion_tokens or 0,
        "ttft_ms": ttft,
        "latency_ms": latency,
        "finish_reason": _finish(body.choices[0].finish_reason if body.choices else None),
        "mode": "speculative" if spec is not None else "plain",
    }
    if spec is not None:
        histogram = list(spec.acceptance_histogram or [])
        fields |= {
            "num_spec_steps": spec.num_spec_steps if spec.num_spec_steps is not None else sum(histogram),
            "num_draft_tokens": spec.num_draft_tokens or 0,
            "num_accepted_tokens": spec.num_accepted_draft_tokens or 0,
            "histogram": histogram,
            "gamma": spec.num_spec_tokens if spec.num_spec_tokens is not None else max(len(histogram) - 1, 0),
        }
    queued = metrics.queue_time_ms or 0.0
    return fields, body.id, body.model, None if latency is None else latency + queued


def _llamacpp(body: LlamacppIn) -> tuple[dict[str, Any], str | None, str | None, float | None]:
    t = body.timings
    latency = t.prompt_ms + t.predicted_ms if t.prompt_ms is not None and t.predicted_ms is not None else None
    finish = body.choices[0].finish_reason if body.choices else body.stop_type
    fields: dict[str, Any] = {
        "prompt_tokens": t.prompt_n or 0,
        "output_tokens": t.predicted_n or 0,
        "num_draft_tokens": t.draft_n or 0,
        "num_accepted_tokens": t.draft_n_accepted or 0,
        # The prompt's processing time, after which the first token is sampled: TTFT seen by the server.
        "ttft_ms": t.prompt_ms,
        "latency_ms": latency,
        "finish_reason": _finish(finish),
        "mode": "speculative" if t.draft_n is not None else "plain",
    }
    return fields, body.id, body.model, latency


def _sglang(body: SglangIn) -> tuple[dict[str, Any], str | None, str | None, float | None]:
    m = body.meta_info
    latency = m.e2e_latency * 1000 if m.e2e_latency is not None else None
    ttft = None
    if m.request_received_ts is not None and m.prefill_finished_ts is not None:
        ttft = max(0.0, (m.prefill_finished_ts - m.request_received_ts) * 1000)
    steps, drafted = m.spec_verify_ct or 0, m.spec_draft_token_num or 0
    # SGLang drafts the same number every step (drafted = steps x (num_draft_tokens - 1)).
    gamma = drafted // steps if steps and drafted % steps == 0 else max(len(m.spec_accept_histogram or []) - 1, 0)
    fields: dict[str, Any] = {
        "prompt_tokens": m.prompt_tokens or 0,
        "output_tokens": m.completion_tokens or 0,
        "num_spec_steps": steps,
        "num_draft_tokens": drafted,
        "num_accepted_tokens": m.spec_accept_token_num or 0,
        "histogram": list(m.spec_accept_histogram or []),
        "gamma": min(gamma, MAX_SPECULATIVE_TOKENS),
        "ttft_ms": ttft,
        "latency_ms": latency,
        "finish_reason": _finish(m.finish_reason.type if m.finish_reason else None),
        "mode": "speculative" if m.spec_verify_ct is not None else "plain",
    }
    if m.request_received_ts is not None:
        fields["ts_start"] = datetime.fromtimestamp(m.request_received_ts, UTC)
    if m.decode_finished_ts is not None:
        fields["ts_end"] = datetime.fromtimestamp(m.decode_finished_ts, UTC)
    return fields, m.id, None, latency
