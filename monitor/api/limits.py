"""Body size and time limits for every request, as one pure ASGI middleware.

The body is read here, up to the limit, before any route sees it: a declared ``Content-Length``
over the limit is refused without reading, an undeclared (chunked) body is cut off at the limit.
The time limit runs from the request's arrival to the start of its response, and covers reading the
body, so a client that trickles bytes cannot hold a worker; a streamed response (server-sent events)
is not cut once it has started.

In proxy mode a forwarded request (``proxied``) has a limit of its own (``proxy.max_body_bytes``:
engines take long prompts and images), no time limit here (the proxy's own timeout applies), and a
413 in the OpenAI error shape its client parses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from monitor.api.errors import TrackedSend

log = logging.getLogger(__name__)


class LimitsMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        timeout_s: float,
        untimed: tuple[str, ...] = (),
        proxied: Callable[[Scope], bool] | None = None,
        proxied_max_body_bytes: int = 0,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.timeout_s = timeout_s
        self.untimed = frozenset(untimed)
        self.proxied = proxied
        self.proxied_max_body_bytes = proxied_max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.proxied is not None and self.proxied(scope):
            await self._handle(scope, receive, send, self.proxied_max_body_bytes, openai=True)
            return
        if self.timeout_s <= 0 or scope["path"] in self.untimed:
            await self._handle(scope, receive, send, self.max_body_bytes)
            return
        tracked = TrackedSend(send)
        task = asyncio.ensure_future(self._handle(scope, receive, tracked, self.max_body_bytes))
        done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        if task in done:
            task.result()
            return
        if tracked.started:  # a streamed response is under way: it ends on its own
            await task
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if not tracked.started:
            log.warning("request timed out after %.1f s: %s %s", self.timeout_s, scope["method"], scope["path"])
            await _error(send, 504, "timeout", f"the request took longer than {self.timeout_s:g} s")

    async def _handle(self, scope: Scope, receive: Receive, send: Send, limit: int, *, openai: bool = False) -> None:
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _error(send, 413, "body_too_large", f"the body exceeds {limit} bytes", openai=openai)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _error(send, 413, "body_too_large", f"the body exceeds {limit} bytes", openai=openai)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            # The whole body once; afterwards the real channel, where a disconnect will show.
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _error(send: Send, status: int, code: str, message: str, *, openai: bool = False) -> None:
    shaped = {"error": {"message": message, "type": "invalid_request_error", "code": code}} if openai else None
    body = json.dumps(shaped or {"error": code, "message": message}).encode()
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 413:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
