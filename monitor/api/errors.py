"""One JSON error shape for every failure the API reports, and the handlers that produce it.

Every error body is ``{"error": CODE, "message": TEXT}``, plus ``"detail": [{"loc", "msg", "type"}]``
for validation problems. Bodies never carry stack traces or the input that was sent: a hostile or
private body is never echoed back, and tracebacks go to the log only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from monitor.log_safe import traceback_text

log = logging.getLogger(__name__)

Loc = tuple[str | int, ...]
BODY_TOO_LARGE: Final = "the body exceeds api.max_body_bytes"
NOT_JSON: Final = "the body is not JSON text (or not UTF-8)"


class Problem(BaseModel):
    """One validation problem: where (``loc``), what (``msg``) and its kind (``type``)."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    """The body of every 4xx and 5xx response."""

    error: str
    message: str
    detail: list[Problem] | None = None


class ApiError(Exception):
    """An error the API answers with ``status`` and an :class:`ErrorBody`."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        detail: Sequence[Problem] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.detail = list(detail) if detail is not None else None
        self.headers = dict(headers or {})

    def response(self) -> JSONResponse:
        body = ErrorBody(error=self.code, message=self.message, detail=self.detail)
        return JSONResponse(body.model_dump(exclude_none=True), status_code=self.status, headers=self.headers)


def described(meanings: Mapping[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for error statuses: each with the error body and what it means on that route."""
    return {status: {"model": ErrorBody, "description": meaning} for status, meaning in meanings.items()}


def validation_error(problems: Sequence[Problem], what: str = "request") -> ApiError:
    count = len(problems)
    return ApiError(
        422, "validation_error", f"the {what} has {count} problem{'s' if count != 1 else ''}", detail=problems
    )


def off_calendar(loc: Loc) -> ApiError:
    """422 for a time that cannot be converted to UTC or rounded to a minute (year 1 or 9999)."""
    msg = "is too close to the edge of the calendar: use a time between 0001-01-02 and 9999-12-30"
    return validation_error([Problem(loc=list(loc), msg=msg, type="value_error")])


def problems_of(error: ValidationError, prefix: Loc = (), limit: int = 50) -> list[Problem]:
    """Pydantic's errors without the input values (never echo a body), at most ``limit`` of them."""
    return [
        Problem(loc=[*prefix, *item["loc"]], msg=item["msg"], type=item["type"])
        for item in error.errors(include_url=False, include_input=False, include_context=False)[:limit]
    ]


# Error codes of the plain HTTP statuses Starlette raises itself (unknown route, wrong method).
_STATUS_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large", 400: "bad_request"}


def install(app: FastAPI) -> None:
    """Route the API's own and the framework's exceptions to the one error shape.

    Anything else is :class:`UnhandledErrorMiddleware`'s, which the app installs outermost.
    """

    async def on_api_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def on_request_validation(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        problems = [
            Problem(loc=list(item.get("loc", ())), msg=str(item.get("msg", "")), type=str(item.get("type", "")))
            for item in list(exc.errors())[:50]
        ]
        return validation_error(problems).response()

    async def on_http(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _STATUS_CODES.get(exc.status_code, "http_error")
        headers: dict[str, Any] = dict(exc.headers or {})
        return ApiError(exc.status_code, code, str(exc.detail), headers=headers).response()

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_request_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)


class TrackedSend:
    """An ASGI ``send`` that remembers whether the response has started: after that, no other answer fits."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)


class ResponseCutShortError(RuntimeError):
    """Raised to the server for an error after the response began: it then closes the connection."""


class UnhandledErrorMiddleware:
    """The last line: an exception nothing else handled becomes one logged 500 with the JSON error body.

    Not an exception handler for ``Exception``: Starlette runs that one in its outermost middleware,
    which re-raises after answering, so the server logged the traceback a second time and, the
    response being out, reset the keep-alive connection without ``Connection: close``: the client's
    next request on it failed. Here the exception ends with the answer. The log line carries method,
    path and a traceback without messages (an error's text may quote the request's values).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracked = TrackedSend(send)
        try:
            await self.app(scope, receive, tracked)
        except Exception as error:
            log.error("unhandled error on %s %s\n%s", scope["method"], scope["path"], traceback_text(error))
            if tracked.started:
                # Part of a response is out: only a closed connection tells the client it is incomplete.
                raise ResponseCutShortError("the response was cut short by the error logged before") from None
            response = ApiError(500, "internal_error", "the server failed to handle the request").response()
            await response(scope, receive, send)
