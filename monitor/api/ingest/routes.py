"""``POST /v1/events`` and the adapters ``POST /v1/events/{vllm,llamacpp,sglang}``.

A 202 is sent only after :meth:`monitor.ingest.recorder.Recorder.store_batch` returned, i.e. once the
whole batch is committed to the database or fsync'd to the spool (when the database is away): a
client that got a 202 can forget the batch. Parsing, validation and the write run on a worker
thread so that a large batch does not stall the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from decoder.record import RecordError
from monitor.api.auth import GuardedRoute, require
from monitor.api.errors import BODY_TOO_LARGE, NOT_JSON, ApiError, Problem, described, validation_error
from monitor.api.events import EventBatchIn, EventIn, loads, parse_body
from monitor.api.ingest.adapters import MODELS, STACKS, Stack, parse_adapter_events
from monitor.api.state import ApiState, api_state
from monitor.ingest.recorder import RecorderClosedError

log = logging.getLogger(__name__)

guard = require("ingest")
router = APIRouter(tags=["ingest"], dependencies=[Depends(guard)], responses=guard.responses, route_class=GuardedRoute)


class IngestResult(BaseModel):
    """Every record of the batch is in exactly one of ``stored``, ``duplicates`` and ``spooled``."""

    received: int
    stored: int
    duplicates: int
    spooled: int


ERRORS = described(
    {
        400: NOT_JSON,
        413: BODY_TOO_LARGE,
        422: "field-level problems; nothing of the batch was stored",
        503: "the server is shutting down",
    }
)


def _body_schema(*models: type[BaseModel]) -> dict[str, Any]:
    # The body is parsed by hand (hostile JSON, all-or-nothing batches); the document still shows its shape.
    schemas = [{"$ref": f"#/components/schemas/{m.__name__}"} for m in models]
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"oneOf": schemas} if len(schemas) > 1 else schemas[0]}},
        }
    }


async def _ingest(state: ApiState, body: bytes, parse: Callable[[bytes], list[Any]]) -> IngestResult:
    def work() -> IngestResult:
        records = parse(body)
        try:
            with state.write_lock:
                result = state.recorder.store_batch(records)
        except RecorderClosedError:
            raise ApiError(503, "shutting_down", "the server is shutting down") from None
        except RecordError as error:  # the store's own check; the API's validation should have caught it first
            problem = Problem(loc=["body", error.field], msg=str(error).split(": ", 1)[-1], type="record_contract")
            raise validation_error([problem]) from None
        return IngestResult(
            received=len(records), stored=result.stored, duplicates=result.duplicates, spooled=result.spooled
        )

    return await anyio.to_thread.run_sync(work)


@router.post(
    "/v1/events",
    status_code=202,
    response_model=IngestResult,
    responses=ERRORS,
    summary="Store one record or a batch of records",
    openapi_extra=_body_schema(EventIn, EventBatchIn),
)
async def post_events(request: Request) -> IngestResult:
    """One record, or ``{"events": [...]}`` of up to ``api.max_batch_size``; all-or-nothing per batch."""
    state = api_state(request)
    limit = state.settings.api.max_batch_size
    return await _ingest(state, await request.body(), lambda body: parse_body(body, limit))


def _adapter_route(stack: Stack) -> None:
    model = MODELS[stack]

    async def post_stack_event(request: Request) -> IngestResult:
        state = api_state(request)
        limit = state.settings.api.max_batch_size
        return await _ingest(state, await request.body(), lambda body: parse_adapter_events(stack, loads(body), limit))

    post_stack_event.__doc__ = (
        f"A {stack} response plus ``workload`` (and optional draftwatch fields), mapped onto the record as "
        'docs/api.md describes; ``{"events": [...]}`` for several.'
    )
    router.add_api_route(
        f"/v1/events/{stack}",
        post_stack_event,
        methods=["POST"],
        status_code=202,
        response_model=IngestResult,
        responses=ERRORS,
        summary=f"Store per-request figures reported by {stack}",
        operation_id=f"post_events_{stack}",
        openapi_extra=_body_schema(model),
    )


for _stack in STACKS:
    _adapter_route(_stack)
