"""The serving stack behind proxy mode: keep-alive connections, spoken to through httpcore.

httpx's client layers (URL merging, auth and redirect handling, cookies, event hooks) cost about
0.4 ms a request on this machine, as much as the rest of the proxy, and httpcore's pool scans every
connection (a ``poll`` system call each) whenever it assigns a request: at 32 concurrent clients
that scan took a third of the proxy's time. The proxy needs neither, so it keeps its own stack of
idle HTTP/1.1 connections (httpcore's, one per request in flight) and reuses the newest, after one
look at it alone: an idle connection the upstream has closed meanwhile (llama-server closes
kept-alive connections without saying so) is readable, and is dropped before anything is written.

A generation must never run twice, so a request goes out a second time only when the upstream
cannot have started it: the connection could not be opened, or the request could not be written
whole. Once it was written, a connection cut before the answer is a 502, not a retry: the
upstream may have read the request and be generating. A refused connection is not tried again
here (the replica is down: a second try would be refused too) but raised as
:class:`UpstreamRefusedError`, which the proxy sends once to another replica of the pool. Errors
become two kinds: :class:`UpstreamTimeoutError` (nothing within ``proxy.timeout_s``) and
:class:`UpstreamUnavailableError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

import httpcore

log = logging.getLogger(__name__)

Headers = Sequence[tuple[bytes, bytes]]
# Idle connections kept for reuse; a burst beyond them opens new ones, closed once idle.
KEEPALIVE: Final = 64
KEEPALIVE_EXPIRY_S: Final = 30.0
# Sends of a request that never reached the upstream whole, after the first (see the module docstring).
RETRIES: Final = 1


class UpstreamError(Exception):
    """The upstream did not answer as HTTP should; ``str()`` names what happened, never a body."""


class UpstreamTimeoutError(UpstreamError):
    """Nothing arrived within ``proxy.timeout_s``."""


class UpstreamUnavailableError(UpstreamError):
    """Refused, reset or cut: the upstream cannot be reached, or stopped in mid-answer."""


class UpstreamRefusedError(UpstreamUnavailableError):
    """The connection could not be opened: nothing was sent, so another replica may take the request."""


class Upstream:
    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        self.url = url
        self.netloc = parts.netloc.rpartition("@")[2]
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._origin = httpcore.Origin(parts.scheme.encode(), (parts.hostname or "").encode(), port)
        self._prefix = parts.path.rstrip("/").encode()
        t = timeout_s
        self._timeouts = {"connect": min(10.0, t), "read": t, "write": t, "pool": t}
        self._idle: list[httpcore.AsyncHTTPConnection] = []

    async def send(self, method: str, target: bytes, headers: Headers, body: bytes) -> UpstreamResponse:
        """Send one request (``target``: path and query); the response's body is read as it arrives."""
        o = self._origin
        url = httpcore.URL(scheme=o.scheme, host=o.host, port=o.port, target=self._prefix + target)
        sent = [(b"host", self.netloc.encode()), *headers, (b"content-length", str(len(body)).encode())]
        retries = RETRIES
        while True:
            delivery = _Delivery()
            extensions = {"timeout": self._timeouts, "trace": delivery.trace}
            request = httpcore.Request(method, url, headers=sent, content=body, extensions=extensions)
            connection = await self._take_idle() or self._connection()
            try:
                response = await connection.handle_async_request(request)
            except httpcore.TimeoutException as error:
                await connection.aclose()
                raise UpstreamTimeoutError(type(error).__name__) from None
            except httpcore.ConnectError as error:
                await connection.aclose()
                raise UpstreamRefusedError(type(error).__name__) from None
            except (httpcore.NetworkError, httpcore.ProtocolError) as error:
                await connection.aclose()
                if retries and not delivery.written:
                    retries -= 1
                    log.info("upstream %s: %s before the request was written; sending it once more",
                             self.netloc, type(error).__name__)  # fmt: skip
                    continue
                raise UpstreamUnavailableError(type(error).__name__) from None
            return UpstreamResponse(response, functools.partial(self._release, connection))

    async def _take_idle(self) -> httpcore.AsyncHTTPConnection | None:
        """The newest idle connection still open; those the upstream closed (or expired) are dropped on the way."""
        while self._idle:
            connection = self._idle.pop()
            if not connection.has_expired() and connection.is_idle():
                return connection
            await connection.aclose()
        return None

    async def reachable(self, timeout_s: float) -> bool:
        """Whether the upstream takes a connection within ``timeout_s`` (readiness: nothing is sent on it)."""
        try:
            async with asyncio.timeout(timeout_s):
                _, writer = await asyncio.open_connection(self._origin.host.decode(), self._origin.port)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    def _connection(self) -> httpcore.AsyncHTTPConnection:
        return httpcore.AsyncHTTPConnection(self._origin, keepalive_expiry=KEEPALIVE_EXPIRY_S, http1=True, http2=False)

    async def _release(self, connection: httpcore.AsyncHTTPConnection) -> None:
        if connection.is_idle() and len(self._idle) < KEEPALIVE:
            self._idle.append(connection)
        else:
            await connection.aclose()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.aclose()


class _Delivery:
    """Whether the request reached the socket whole, told by httpcore's trace events.

    httpcore swallows a failed write and goes on to read an answer (a server may refuse a request
    early with one), so the error that ends the exchange does not say whether the request went out.
    """

    __slots__ = ("written",)

    def __init__(self) -> None:
        self.written = False

    async def trace(self, event: str, info: Mapping[str, Any]) -> None:
        if event == "http11.send_request_body.complete":
            self.written = True


class UpstreamResponse:
    def __init__(self, response: httpcore.Response, release: Callable[[], Awaitable[None]]) -> None:
        self._response = response
        self._release = release
        self._closed = False
        self.status = response.status
        self.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers]

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name), "")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; a cut connection raises :class:`UpstreamUnavailableError`, silence a timeout."""
        stream = self._response.aiter_stream()
        while True:
            try:
                chunk = await anext(stream)
            except StopAsyncIteration:
                return
            except httpcore.TimeoutException as error:
                raise UpstreamTimeoutError(type(error).__name__) from None
            except (httpcore.NetworkError, httpcore.ProtocolError) as error:
                raise UpstreamUnavailableError(type(error).__name__) from None
            yield chunk

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def aclose(self) -> None:
        """Close the body; a connection left reusable goes back to the idle ones."""
        if self._closed:
            return
        self._closed = True
        await self._response.aclose()
        await self._release()
