"""The serving stack behind proxy mode: keep-alive HTTP/1.1 connections of its own, read by httptools.

httpx's client layers (URL merging, auth and redirect handling, cookies, event hooks) cost about
0.4 ms a request on this machine, and httpcore under them, h11's pure-Python parser behind anyio's
cancel scopes and locks (a timeout scope and a lock per read and write), took more than half of the
proxy's time at 32 concurrent clients. The proxy needs none of it: it writes one request head, and
reads the answer with httptools' C parser (the one uvicorn serves with) on asyncio streams. Its
idle connections are a stack, the newest reused first, after one look at it alone: an idle
connection the upstream has closed meanwhile (llama-server closes kept-alive connections without
saying so) has seen its end, and is dropped before anything is written.

A generation must never run twice, so a request goes out a second time only when the upstream
cannot have started it: the request could not be written whole. Once it was written, a connection
cut before the answer is a 502, not a retry: the upstream may have read the request and be
generating. And a request the upstream answered is never sent again: a server with a body limit
(Go's net/http, most gateways) answers 413 once it has read the head and closes without reading the
rest, so the write of a large body fails with the answer already in; that answer is the request's.
A refused connection is not tried again here (the replica is down: a second try would
be refused too) but raised as :class:`UpstreamRefusedError`, which the proxy sends once to another
replica of the pool. Errors become two kinds: :class:`UpstreamTimeoutError` (nothing within
``proxy.timeout_s``) and :class:`UpstreamUnavailableError`, each named as httpcore named it
(``ConnectError``, ``ReadTimeout``, ...), which the records and logs keep.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Final, TypeVar
from urllib.parse import unquote, urlsplit

import httptools

log = logging.getLogger(__name__)
_T = TypeVar("_T")

Headers = Sequence[tuple[bytes, bytes]]
# Idle connections kept for reuse; a burst beyond them opens new ones, closed once idle.
KEEPALIVE: Final = 64
KEEPALIVE_EXPIRY_S: Final = 30.0
# Sends of a request that never reached the upstream whole, after the first (see the module docstring).
RETRIES: Final = 1
READ_SIZE: Final = 65536
# A large body goes to the socket in pieces of this size (see _Connection._pour).
PIECE_BYTES: Final = 1 << 20
# How long a failed write waits for the watch on its answer to end: the connection's end reaches the
# reader right after what the upstream sent before it, so this bounds a wait that has nothing to wait for.
EARLY_ANSWER_S: Final = 1.0


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
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/").encode()
        self._authorization = basic_authorization(url)
        self._connect_s = min(10.0, timeout_s)
        self._timeout_s = timeout_s
        self._idle: list[_Connection] = []

    async def send(self, method: str, target: bytes, headers: Headers, body: bytes) -> UpstreamResponse:
        """Send one request (``target``: path and query); the response's body is read as it arrives."""
        target = self._prefix + target
        if any(byte <= 0x20 or byte == 0x7F for byte in target):
            # The caller's fault, not the upstream's: no UpstreamError, which would count against the replica's
            # health (the proxy's entry answers such a client itself, monitor/proxy/forward/routes.py).
            raise ValueError("no request line can carry this target")
        lines = [b"%s %s HTTP/1.1\r\nhost: %s\r\n" % (method.encode(), target, self.netloc.encode())]
        lines += [b"%s: %s\r\n" % (name, value) for name, value in headers]
        if self._authorization is not None and not any(name.lower() == b"authorization" for name, _ in headers):
            lines.append(b"authorization: %s\r\n" % self._authorization)  # a client's own credentials are what it means
        lines.append(b"content-length: %d\r\n\r\n" % len(body))
        head = b"".join(lines)
        retries = RETRIES
        while True:
            connection = self._take_idle() or await self._connect()
            try:
                await connection.write(head, body, self._timeout_s)
            except UpstreamUnavailableError as error:
                connection.close()
                if retries:
                    retries -= 1
                    log.info("upstream %s: %s before the request was written; sending it once more",
                             self.netloc, error)  # fmt: skip
                    continue
                raise
            except BaseException:
                connection.close()
                raise
            try:
                return await UpstreamResponse.read_head(connection, method, self._timeout_s, self._keep)
            except BaseException:
                connection.close()
                raise

    def _take_idle(self) -> _Connection | None:
        """The newest idle connection still open; those the upstream closed (or expired) are dropped on the way."""
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable():
                return connection
            connection.close()
        return None

    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self._connect_s):
                reader, writer = await asyncio.open_connection(self._host, self._port, ssl=self._ssl)
        except TimeoutError:
            raise UpstreamTimeoutError("ConnectTimeout") from None
        except OSError:
            raise UpstreamRefusedError("ConnectError") from None
        return _Connection(reader, writer)

    async def reachable(self, timeout_s: float) -> bool:
        """Whether the upstream takes a connection within ``timeout_s`` (readiness: nothing is sent on it)."""
        try:
            async with asyncio.timeout(timeout_s):
                _, writer = await asyncio.open_connection(self._host, self._port)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    def _keep(self, connection: _Connection) -> None:
        if len(self._idle) < KEEPALIVE:
            connection.idle_until = time.monotonic() + KEEPALIVE_EXPIRY_S
            self._idle.append(connection)
        else:
            connection.close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def basic_authorization(url: str) -> bytes | None:
    """The HTTP Basic ``Authorization`` value of a base URL's ``user:password@`` (percent-decoded), or None.

    >>> basic_authorization("http://ada:p%40ss@h:8080"), basic_authorization("http://h:8080")
    (b'Basic YWRhOnBAc3M=', None)
    """
    user_info, at, _ = urlsplit(url).netloc.rpartition("@")
    if not at:
        return None
    user, _, password = user_info.partition(":")
    return b"Basic " + base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode())


class _Connection:
    """One HTTP/1.1 connection to the upstream, between requests idle until ``idle_until``."""

    __slots__ = ("_early", "_unsent", "idle_until", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_until = 0.0
        # The read begun while a large request was written (see write): the next read's bytes.
        self._early: asyncio.Task[bytes] | None = None
        # A large body is handed to the socket a piece at a time: whether pieces were still to go when the write
        # ended (an early answer), which the transport's empty buffer does not tell.
        self._unsent = False

    def reusable(self) -> bool:
        """Open, not expired, and its end not seen: an upstream that closed it idle has sent that end."""
        return time.monotonic() < self.idle_until and not self.writer.is_closing() and not self.reader.at_eof()

    async def write(self, head: bytes, body: bytes, timeout_s: float) -> None:
        """The request onto the socket, or as much of it as went before the upstream answered.

        :class:`UpstreamUnavailableError` when it could not be written and nothing came back: nothing
        was started. A body under one read's size goes in one write, which the socket's buffer takes
        whole: an answer to it, early or not, is read after it as any other.
        """
        if len(body) >= READ_SIZE:
            await self._write_watched(head, body, timeout_s)
            return
        try:
            async with asyncio.timeout(timeout_s):
                self.writer.write(head + body)
                await self.writer.drain()
        except TimeoutError:
            raise UpstreamTimeoutError("WriteTimeout") from None
        except OSError:
            raise UpstreamUnavailableError("WriteError") from None

    async def _write_watched(self, head: bytes, body: bytes, timeout_s: float) -> None:
        """A large request, written while its answer is watched for: what came first is the next read's.

        An upstream that answers before it has read the body (a 413) may close without reading it, and
        the write fails, or leave it unread, and the write never ends: either way the request has its answer.
        """
        answer = self._early = _quiet(asyncio.ensure_future(self.reader.read(READ_SIZE)))
        drain = _quiet(asyncio.ensure_future(self._pour(head, body)))
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.wait((drain, answer), return_when=asyncio.FIRST_COMPLETED)
                if not _answered(answer):
                    await drain
        except TimeoutError:
            raise UpstreamTimeoutError("WriteTimeout") from None
        except OSError:
            # The failed write ended the connection, and its reader after what the upstream sent before it closed.
            await asyncio.wait((answer,), timeout=EARLY_ANSWER_S)
            if not _answered(answer):
                raise UpstreamUnavailableError("WriteError") from None
        finally:
            drain.cancel()

    async def _pour(self, head: bytes, body: bytes) -> None:
        """``head`` and ``body`` onto the socket, the body in pieces of :data:`PIECE_BYTES`, each once the last drained.

        Written whole, what the socket did not take at once would be copied into the transport's buffer:
        a second copy of every large body in flight.
        """
        self._unsent = True
        self.writer.write(head)
        view = memoryview(body)
        for start in range(0, len(body), PIECE_BYTES):
            self.writer.write(view[start : start + PIECE_BYTES])
            await self.writer.drain()
        self._unsent = False

    def written(self) -> bool:
        """Whether the request went whole (an answer that came before its end leaves the rest unsent)."""
        return not self._unsent and not self.writer.transport.get_write_buffer_size()

    async def read(self, timeout_s: float) -> bytes:
        try:
            async with asyncio.timeout(timeout_s):
                if self._early is not None:
                    early, self._early = self._early, None
                    return await early
                return await self.reader.read(READ_SIZE)
        except TimeoutError:
            raise UpstreamTimeoutError("ReadTimeout") from None
        except OSError:
            raise UpstreamUnavailableError("ReadError") from None

    def close(self) -> None:
        if self._early is not None:
            self._early.cancel()
        if self.written():
            self.writer.close()
        else:
            self.writer.transport.abort()  # not flushed to an upstream that answered and may never read the rest


def _quiet(task: asyncio.Task[_T]) -> asyncio.Task[_T]:
    """``task``, its exception taken when it ends: one nobody awaits (the connection closed first) is no log line."""
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return task


def _answered(read: asyncio.Task[bytes]) -> bool:
    """Whether the watch on the answer has bytes of it (not the connection's end, nor its error)."""
    return read.done() and not read.cancelled() and read.exception() is None and bool(read.result())


class _Message:
    """httptools' callbacks for one response: its headers, the body pieces not yet taken, and whether it ended."""

    __slots__ = ("body", "complete", "head_done", "headers", "keep_alive", "parser")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.head_done = False
        self.complete = False
        self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True
        # Asked here: once the message is complete the parser has reset, and says False.
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            raise UpstreamUnavailableError("RemoteProtocolError") from None


class UpstreamResponse:
    def __init__(
        self,
        connection: _Connection,
        message: _Message,
        timeout_s: float,
        keep: Callable[[_Connection], None],
        *,
        head: bool,
    ) -> None:
        self._connection = connection
        self._message = message
        self._timeout_s = timeout_s
        self._keep = keep
        self._closed = False
        self.status = message.parser.get_status_code()
        self.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.headers]
        # A HEAD answer has no body, whatever its Content-Length says; one framed by neither a length nor
        # chunks ends when the upstream closes the connection.
        if head:
            message.complete = True
        names = {k.lower() for k, _ in self.headers}
        self._until_close = "content-length" not in names and "transfer-encoding" not in names
        self._reusable = not head

    @classmethod
    async def read_head(
        cls,
        connection: _Connection,
        method: str,
        timeout_s: float,
        keep: Callable[[_Connection], None],
    ) -> UpstreamResponse:
        """Read until the response's head is in (the body read with it is kept for :meth:`chunks`)."""
        message = _Message()
        while not message.head_done:
            data = await connection.read(timeout_s)
            if not data:
                raise UpstreamUnavailableError("RemoteProtocolError")  # closed without an answer
            message.feed(data)
        return cls(connection, message, timeout_s, keep, head=method == "HEAD")

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name), "")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; a cut connection raises :class:`UpstreamUnavailableError`, silence a timeout."""
        message = self._message
        while True:
            if message.body:
                pieces, message.body = message.body, []
                for piece in pieces:
                    yield piece
            if message.complete:
                return
            data = await self._connection.read(self._timeout_s)
            if not data:
                if not self._until_close:
                    raise UpstreamUnavailableError("RemoteProtocolError")  # cut before the body's end
                message.complete = True
                self._reusable = False
                continue
            message.feed(data)

    @property
    def complete(self) -> bool:
        """The upstream has sent the whole body: what :meth:`chunks` has not yielded yet is already here."""
        return self._message.complete

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def close(self) -> None:
        """Close the body; a connection left reusable (its answer read to the end) goes back to the idle ones.

        It never waits, so a cancelled request (the client left) closes its connection all the same.
        """
        if self._closed:
            return
        self._closed = True
        message = self._message
        read_whole = message.complete and not message.body and self._reusable
        if read_whole and message.keep_alive and self._connection.written():
            self._keep(self._connection)
        else:
            self._connection.close()
