"""The adapter endpoints: a serving stack's own response, plus what only the caller knows, as a record.

A body is the stack's response object (a non-streamed body, or the final chunk of a stream) with
draftwatch fields added at its top level: ``workload``, and optionally ``request_id``, timestamps,
``drafter``, model names and versions, sampling settings, ``mode``, what the caller knows of the
deployment (``speculative``, ``num_speculative_tokens``) and ``finish_reason`` (a stream's final
usage chunk has no choices to say it). :mod:`monitor.ingest.stacks` reads the response, refusing
one that lacks what its stack must report; this module adds the caller's fields and passes the
record through the same validation as ``POST /v1/events`` (:mod:`monitor.api.events`). Fields of
the response that are not read are ignored, generated text included: it is never stored.
docs/api.md maps every field.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Final

from pydantic import ConfigDict, Field, StrictBool, ValidationError
from pydantic.config import JsonDict

from decoder.record import FinishReason, Mode, RequestRecord
from monitor.api.errors import Loc, Problem, problems_of, validation_error
from monitor.api.events import (
    Gamma,
    Millis,
    OptionalText,
    PromptHash,
    RequestId,
    ShortText,
    Temperature,
    Timestamp,
    TopP,
    Workload,
    all_or_nothing,
    record_from,
)
from monitor.ingest.stacks import (
    PARSERS,
    STACKS,
    LlamacppResponse,
    SglangResponse,
    Stack,
    StackError,
    StackReport,
    VllmResponse,
    reported,
)
from monitor.ingest.stacks.report import Lenient

__all__ = ["MODELS", "STACKS", "AdapterFields", "Stack", "map_response", "parse_adapter_events", "record_of"]


class AdapterFields(Lenient):
    """What the caller adds to a stack's response."""

    workload: Workload
    request_id: RequestId | None = None
    ts_start: Timestamp | None = None
    ts_end: Timestamp | None = None
    target_model: ShortText | None = None
    drafter: ShortText = "unknown"
    draft_model: OptionalText = None
    target_version: OptionalText = None
    draft_version: OptionalText = None
    mode: Mode | None = None
    speculative: StrictBool | None = Field(
        default=None,
        description="whether the deployment runs speculative decoding; unset: mode speculative says yes, "
        "plain or holdout no, no mode infers it from the response",
    )
    num_speculative_tokens: Gamma | None = None
    finish_reason: FinishReason | None = Field(
        default=None, description="how the request ended, where the posted response does not say"
    )
    temperature: Temperature = 0.0
    top_p: TopP = 1.0
    prompt_hash: PromptHash = None
    ttft_ms: Millis | None = Field(
        default=None,
        description="time to the first token as the caller measured it (a stream's first chunk); "
        "unset: the stack's own",
    )
    decode_ms: Millis | None = Field(
        default=None,
        description="the decode phase as the caller measured it (a stream's first to last text chunk), used where "
        "the stack reports no decode time of its own",
    )


def _one_of(*alternatives: JsonDict) -> JsonDict:
    return {"anyOf": list(alternatives)}


def _present(name: str) -> JsonDict:
    return {"required": [name]}


# The document states what map_response checks: an id and a model name, from the caller or the stack.
_IDENTIFIED: Final[JsonDict] = {
    "allOf": [_one_of(_present("request_id"), _present("id")), _one_of(_present("target_model"), _present("model"))]
}


class VllmIn(AdapterFields, VllmResponse):
    """A vLLM chat, completions or Responses object (or a stream's final usage chunk), plus draftwatch fields."""

    model_config = ConfigDict(json_schema_extra=_IDENTIFIED)


class LlamacppIn(AdapterFields, LlamacppResponse):
    """A llama.cpp server response (``/completion`` or its OpenAI-compatible endpoints), plus draftwatch fields."""

    model_config = ConfigDict(json_schema_extra=_IDENTIFIED)


class SglangIn(AdapterFields, SglangResponse):
    """An SGLang ``/generate`` response (its ``meta_info``), plus draftwatch fields; SGLang names no model."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                _one_of(_present("request_id"), {"properties": {"meta_info": _present("id")}}),
                _present("target_model"),
            ]
        }
    )


# The bodies as the document shows them; parsing takes the two halves apart.
MODELS: Final[dict[Stack, type[AdapterFields]]] = {"vllm": VllmIn, "llamacpp": LlamacppIn, "sglang": SglangIn}


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
    return all_or_nothing(zip(items, prefixes, strict=True), partial(map_response, stack),
                          "batch" if len(items) > 1 else "request")  # fmt: skip


def map_response(stack: Stack, item: Any, loc: Loc = ("body",)) -> RequestRecord:
    """The record of one posted response: the caller's fields and the stack's report, both checked first."""
    if not isinstance(item, dict):
        raise validation_error([Problem(loc=list(loc), msg=f"expected a {stack} response object", type="type_error")])
    problems: list[Problem] = []
    fields: AdapterFields | None = None
    report: StackReport | None = None
    try:
        fields = AdapterFields.model_validate(item)
    except ValidationError as error:
        problems += problems_of(error, loc)
    try:
        report = PARSERS[stack](
            item,
            speculative=_deployment(fields),
            num_speculative_tokens=fields.num_speculative_tokens if fields else None,
        )
    except StackError as error:
        problems += [Problem(loc=[*loc, *p.loc], msg=p.msg, type=p.type) for p in error.problems]
    if fields is None or report is None:
        raise validation_error(problems[:50])
    return record_of(fields, report, loc)


def _deployment(fields: AdapterFields | None) -> bool | None:
    if fields is None or fields.speculative is not None:
        return None if fields is None else fields.speculative
    # A posted mode says how the request was decoded, hence how its deployment decodes.
    return None if fields.mode is None else fields.mode == "speculative"


def record_of(fields: AdapterFields, report: StackReport, loc: Loc) -> RequestRecord:
    """The record of a stack's report and the caller's fields; ``loc`` prefixes the problems of a 422.

    The caller's fields win over the stack's (``request_id``, ``target_model``, ``finish_reason``,
    timestamps, a stream's ``ttft_ms``); without timestamps ``ts_end`` is the stack's, else now, and ``ts_start`` is
    ``ts_end`` minus the queueing and the latency the report gives.
    """
    stack = report.stack
    request_id = fields.request_id or report.request_id
    target_model = fields.target_model or report.model
    finish_reason = fields.finish_reason or report.finish_reason
    absent = {
        name: f"the {stack} response carries none: send {name}"
        for name, value in (("request_id", request_id), ("target_model", target_model))
        if not value
    }
    if finish_reason is None:
        absent["finish_reason"] = (
            f"the {stack} response does not say how the request ended (the final usage chunk of a stream has "
            "no choices): send finish_reason (stop, length or error) from the chunk that carried it"
        )
    if absent:
        raise validation_error([Problem(loc=[*loc, name], msg=msg, type="missing") for name, msg in absent.items()])
    span = timedelta(milliseconds=(report.queue_ms or 0.0) + (report.latency_ms or 0.0))
    stack_end = report.ts_end or (report.ts_start + span if report.ts_start else None)
    ts_end = fields.ts_end or stack_end or datetime.now(UTC)
    ts_start = fields.ts_start or report.ts_start or ts_end - span
    record = {
        "request_id": request_id,
        "ts_start": ts_start,
        "ts_end": ts_end,
        "workload": fields.workload,
        "target_model": target_model,
        "drafter": fields.drafter,
        "draft_model": fields.draft_model,
        "target_version": fields.target_version,
        "draft_version": fields.draft_version,
        "mode": fields.mode or report.mode,
        # Neither mode nor speculative was sent: plain only because the response carried no draft counts.
        "mode_inferred": fields.mode is None and fields.speculative is None and report.mode == "plain",
        **reported(report),
        "temperature": fields.temperature,
        "top_p": fields.top_p,
        "finish_reason": finish_reason,
        "source": f"proxy:{stack}",
        "prompt_hash": fields.prompt_hash,
    }
    if fields.ttft_ms is not None or fields.decode_ms is not None:
        # The caller timed a stream, as the proxy does: its TTFT is the caller's, and the decode time the stack's
        # own where it reports one, else the caller's.
        record["ttft_ms"] = fields.ttft_ms if fields.ttft_ms is not None else report.ttft_ms
        record["decode_ms"] = report.decode_ms if report.decode_ms is not None else fields.decode_ms
    return record_from(record, loc)
