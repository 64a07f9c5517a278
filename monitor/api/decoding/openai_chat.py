"""``POST /v1/chat/completions``: the OpenAI-compatible subset an OpenAI client library needs.

Supported: ``messages``, ``max_tokens`` / ``max_completion_tokens``, ``temperature`` (default 1, as
OpenAI's), ``top_p``, ``stop``, ``seed``, ``stream`` (server-sent events, ``data: [DONE]`` last) and
``stream_options.include_usage``; ``n`` must be 1; other OpenAI parameters are accepted and ignored.
The workload comes from the ``X-Workload`` header, else ``metadata.workload``, else ``default``.
The speculative figures ride an extension field, ``draftwatch`` (the record plus derived figures),
on the response and on the final chunk of a stream.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from decoder.record import RequestRecord, validate_workload
from monitor.api.auth import GuardedRoute
from monitor.api.decoding.generate import (
    DECODE_ERRORS,
    MAX_NEW_TOKENS,
    Message,
    decoder_error,
    derived,
    guard,
    submit,
    worker_of,
)
from monitor.api.decoding.worker import Job, stop_list
from monitor.api.errors import ApiError, Problem, validation_error
from monitor.api.state import offer
from monitor.ingest.capture.rows import decoded_row

log = logging.getLogger(__name__)

router = APIRouter(tags=["decode"], dependencies=[Depends(guard)], responses=guard.responses, route_class=GuardedRoute)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatCompletionIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    messages: Annotated[list[Message], Field(min_length=1, max_length=256)]
    model: Annotated[str, Field(max_length=256)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    stop: (
        Annotated[str, Field(min_length=1, max_length=256)]
        | Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=8)]
        | None
    ) = None
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    n: Annotated[int, Field(ge=1, le=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChoiceOut(BaseModel):
    index: int = 0
    message: ChatMessageOut
    finish_reason: str


class UsageOut(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionOut(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChoiceOut]
    usage: UsageOut
    draftwatch: dict[str, Any] = Field(description="the request's record and its derived figures")


def _workload(header: str | None, body: ChatCompletionIn) -> str:
    tag = header or (body.metadata or {}).get("workload") or "default"
    try:
        return validate_workload(tag)
    except ValueError as error:
        loc: list[str | int] = ["header", "x-workload"] if header else ["body", "metadata", "workload"]
        raise validation_error([Problem(loc=loc, msg=str(error).split(": ", 1)[-1], type="value_error")]) from None


def _usage(record: RequestRecord) -> dict[str, int]:
    return {
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.output_tokens,
        "total_tokens": record.prompt_tokens + record.output_tokens,
    }


def _extension(record: RequestRecord) -> dict[str, Any]:
    return {"record": record.to_dict(), **derived(record)}


def _finish(record: RequestRecord) -> str:
    return "length" if record.finish_reason == "length" else "stop"


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionOut,
    responses={**DECODE_ERRORS, 200: {"content": {"text/event-stream": {}}}},
    summary="OpenAI-compatible chat completions (subset), streaming or not",
)
async def chat_completions(
    request: Request,
    body: ChatCompletionIn,
    x_workload: Annotated[str | None, Header(max_length=64)] = None,
) -> Any:
    worker = worker_of(request)
    workload = _workload(x_workload, body)
    request_id = uuid.uuid4().hex
    messages = [m.model_dump() for m in body.messages]
    options = {
        "workload": workload,
        "max_new_tokens": body.max_completion_tokens or body.max_tokens or 128,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "seed": body.seed,
        "stop": stop_list(body.stop),
        "request_id": request_id,
    }
    job = submit(worker, messages, options)
    model = body.model or worker.decoder.target.name
    items = job.items()
    # Wait for the first piece before answering, so that input the decoder refuses is a 422, not a broken stream.
    try:
        first = await anext(items)
    except StopAsyncIteration:
        raise ApiError(500, "decode_failed", "the decoder produced nothing") from None
    except Exception as error:
        raise decoder_error(error) from error
    offer(request, lambda: decoded_row(messages, options))  # the decoder took it: a refused prompt is not kept
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _sse(job, f"chatcmpl-{request_id}", first, items, model, include_usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    pieces: list[str] = []
    record = first if isinstance(first, RequestRecord) else None
    if isinstance(first, str):
        pieces.append(first)
    try:
        async for item in items:
            if isinstance(item, RequestRecord):
                record = item
            else:
                pieces.append(item)
    except Exception as error:
        raise decoder_error(error) from error
    if record is None:
        raise ApiError(500, "decode_failed", "the decoder produced no record")
    out = ChatCompletionOut(
        id=f"chatcmpl-{record.request_id}",
        created=int(time.time()),
        model=model,
        choices=[ChoiceOut(message=ChatMessageOut(content="".join(pieces)), finish_reason=_finish(record))],
        usage=UsageOut(**_usage(record)),
        draftwatch=_extension(record),
    )
    return JSONResponse(out.model_dump())


async def _sse(
    job: Job,
    chunk_id: str,
    first: str | RequestRecord,
    items: AsyncIterator[str | RequestRecord],
    model: str,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        data = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    yield chunk({"role": "assistant", "content": ""})
    try:
        item: str | RequestRecord | None = first
        while item is not None:
            if isinstance(item, RequestRecord):
                yield chunk({}, _finish(item), draftwatch=_extension(item))
                if include_usage:
                    data = {
                        "id": chunk_id,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": _usage(item),
                    }
                    yield b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
            elif item:
                yield chunk({"content": item})
            item = await anext(items, None)
    except Exception as error:  # headers are gone: report in-band, as OpenAI's API does
        log.warning("decoding failed mid-stream: %s", type(error).__name__)
        problem = decoder_error(error)
        yield b"data: " + json.dumps({"error": {"message": problem.message, "type": problem.code}}).encode() + b"\n\n"
    finally:
        job.cancelled.set()
    yield b"data: [DONE]\n\n"
