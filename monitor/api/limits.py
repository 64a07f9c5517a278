"""Body size and time limits for every request, as one pure ASGI middleware.

The body is read here, up to the limit, before any route sees it: a declared ``Content-Length``
over the limit is refused without reading, an undeclared (chunked) body is cut off at the limit.
The time limit runs from the request's arrival to the start of its response, and covers reading the
body, so a client that trickles bytes cannot hold a worker; a streamed response (server-sent events)
is not cut once it has started.

In proxy mode a forwarded request (``proxied``) has a limit of its own (``proxy.max_body_bytes``:
engines take long prompts and images), no time limit here (the proxy's own timeout applies), and its
refusals in the OpenAI error shape its client parses.

Every request's body must keep arriving: a pause over ``body_timeout_s`` is answered 408. The bodies
held at once, each from its first byte (its declared length at once) until its request's handling
ends, stay under ``max_body_bytes_in_flight``: a body that would pass it is answered 503 with
``Retry-After`` without reading the rest, unless no other body is held (a body alone is never
refused by it). A request's head is limited before this, in uvicorn's protocol
(monitor/api/connections.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from monitor.api.errors import TrackedSend

log = logging.getLogger(__name__)

RETRY_AFTER_S: Final = 1  # past the bound on bodies held: bodies are let go as their requests end


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
        body_timeout_s: float = 0.0,
        max_body_bytes_in_flight: int = 0,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.timeout_s = timeout_s
        self.untimed = frozenset(untimed)
        self.proxied = proxied
        self.proxied_max_body_bytes = proxied_max_body_bytes
        self.body_timeout_s = body_timeout_s or None  # 0: off
        self.max_in_flight = max_body_bytes_in_flight or None  # 0: no bound
        self.in_flight = 0  # body bytes held by the requests under way (one event loop: no lock)

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
        held = 0  # what this request counts in self.in_flight
        try:
            if declared and not self._hold(held, declared):
                await self._busy(send, openai)
                return
            held = declared or 0
            chunks: list[bytes] = []
            size = 0
            while True:
                try:
                    async with asyncio.timeout(self.body_timeout_s):
                        message = await receive()
                except TimeoutError:
                    log.warning("request body stalled for %g s: %s %s", self.body_timeout_s, scope["method"],
                                scope["path"])  # fmt: skip
                    await _error(send, 408, "body_timeout", f"the body's next byte did not arrive within "
                                 f"{self.body_timeout_s:g} s (api.body_timeout_s)", openai=openai)  # fmt: skip
                    return
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    await _error(send, 413, "body_too_large", f"the body exceeds {limit} bytes", openai=openai)
                    return
                if size > held:  # an undeclared (chunked) body, counted as it comes
                    if not self._hold(held, size - held):
                        await self._busy(send, openai)
                        return
                    held = size
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
            body = b"".join(chunks)
            chunks.clear()  # the pieces would otherwise stay alive beside the body for the whole request
            delivered = False

            async def replay() -> Message:
                # The whole body once; afterwards the real channel, where a disconnect will show.
                nonlocal delivered
                if not delivered:
                    delivered = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
        finally:
            self.in_flight -= held

    def _hold(self, held: int, more: int) -> bool:
        """Count ``more`` bytes for a request holding ``held``, unless that passes the bound while others hold some."""
        if self.max_in_flight is not None and self.in_flight + more > self.max_in_flight and self.in_flight > held:
            return False
        self.in_flight += more
        return True

    async def _busy(self, send: Send, openai: bool) -> None:
        log.warning("request body refused: %d bytes of bodies already held (api.max_body_bytes_in_flight)",
                    self.in_flight)  # fmt: skip
        message = (f"the server holds request bodies up to its bound of {self.max_in_flight} bytes at once "
                   "(api.max_body_bytes_in_flight); retry shortly")  # fmt: skip
        await _error(send, 503, "bodies_in_flight", message, openai=openai, retry_after_s=RETRY_AFTER_S)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _error(
    send: Send, status: int, code: str, message: str, *, openai: bool = False, retry_after_s: int | None = None
) -> None:
    kind = "invalid_request_error" if status < 500 else "server_error"
    shaped = {"error": {"message": message, "type": kind, "code": code}} if openai else None
    body = json.dumps(shaped or {"error": code, "message": message}).encode()
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    # The body is left unread: the connection cannot carry another request.
    headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
