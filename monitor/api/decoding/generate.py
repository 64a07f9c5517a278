"""``POST /v1/generate``: the embedded speculative decoder behind HTTP (when ``serve`` has a ``--target``).

Requests go through the single decoder worker (:mod:`monitor.api.decoding.worker`); the record of every
finished request goes to the recorder (the decoder's sink) like any other record.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from decoder.record import RequestRecord
from monitor.api.auth import GuardedRoute, require
from monitor.api.decoding.worker import DecodeWorker, Job, QueueFullError
from monitor.api.errors import BODY_TOO_LARGE, NOT_JSON, ApiError, Problem, described, validation_error
from monitor.api.events import Workload
from monitor.api.state import api_state, offer
from monitor.ingest.capture.rows import decoded_row

guard = require("ingest")
router = APIRouter(tags=["decode"], dependencies=[Depends(guard)], responses=guard.responses, route_class=GuardedRoute)

MAX_PROMPT_CHARS = 200_000
MAX_NEW_TOKENS = 4096


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Annotated[str, Field(pattern="^(system|user|assistant|developer|tool)$")]
    content: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]


class GenerateIn(BaseModel):
    """A prompt (raw text, or with ``chat`` wrapped in the chat template) or chat ``messages``."""

    model_config = ConfigDict(extra="forbid")

    prompt: Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)] | None = None
    messages: Annotated[list[Message], Field(min_length=1, max_length=256)] | None = None
    chat: bool = False
    workload: Workload = "default"
    max_new_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)] = 128
    temperature: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 0.0
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    stop: Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=8)] = []

    @model_validator(mode="after")
    def one_prompt(self) -> GenerateIn:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class GenerateOut(BaseModel):
    text: str
    record: dict[str, Any]
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    tokens_per_second: float | None


DECODE_ERRORS = described(
    {
        400: NOT_JSON,
        413: BODY_TOO_LARGE,
        422: "invalid request (or the prompt does not fit the model's context)",
        503: "the decode queue is full (Retry-After) or no decoder is loaded",
    }
)


def worker_of(request: Request) -> DecodeWorker:
    worker = api_state(request).worker
    if worker is None:
        raise ApiError(503, "no_decoder", "this sidecar decodes nothing: start `draftwatch serve` with --target")
    return worker


def submit(worker: DecodeWorker, prompt: Any, options: dict[str, Any]) -> Job:
    try:
        return worker.submit(prompt, options)
    except QueueFullError as error:
        raise ApiError(503, "queue_full", str(error), headers={"Retry-After": str(error.retry_after_s)}) from None


def decoder_error(error: Exception) -> ApiError:
    """The decoder refuses bad input with ValueError (empty prompt, too long for the context)."""
    if isinstance(error, ValueError):
        return validation_error([Problem(loc=["body"], msg=str(error).splitlines()[0][:300], type="value_error")])
    return ApiError(500, "decode_failed", "the decoder failed on this request")


def derived(record: RequestRecord) -> dict[str, float | None]:
    return {
        "acceptance_rate": record.acceptance_rate,
        "mean_acceptance_length": record.mean_acceptance_length,
        "tokens_per_second": record.tokens_per_second,
    }


@router.post("/v1/generate", response_model=GenerateOut, responses=DECODE_ERRORS, summary="Decode one request")
async def generate(request: Request, body: GenerateIn) -> GenerateOut:
    """Decode speculatively and return the text with the request's record."""
    worker = worker_of(request)
    prompt: Any = body.prompt if body.prompt is not None else [m.model_dump() for m in body.messages or []]
    options = {
        "workload": body.workload,
        "max_new_tokens": body.max_new_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "stop": body.stop,
        "chat": body.chat,
    }
    job = submit(worker, prompt, options)
    pieces: list[str] = []
    record: RequestRecord | None = None
    try:
        async for item in job.items():
            if isinstance(item, RequestRecord):
                record = item
            else:
                pieces.append(item)
    except Exception as error:
        raise decoder_error(error) from error
    if record is None:
        raise ApiError(500, "decode_failed", "the decoder produced no record")
    offer(request, lambda: decoded_row(prompt, options))  # decoded: a prompt the decoder refused is not kept
    return GenerateOut(text="".join(pieces), record=record.to_dict(), **derived(record))
