"""A gateway's limits on a request's head, in uvicorn's HTTP protocol, before any route or middleware sees it.

uvicorn's httptools protocol holds a connection that sends a head a byte at a time (or nothing) for as
long as the client likes, each one a file descriptor, and takes any number and size of header fields;
the proxy then forwards them. Here the head must arrive within ``api.header_timeout_s`` (of the
connection's opening, or of the request's first byte on a kept-alive one; the idle wait between
requests is uvicorn's ``timeout_keep_alive``), else 408 (or, where nothing came, a silent close); a
head over ``api.max_headers`` fields or ``api.max_header_bytes`` gets 431. Either way the connection
is closed and no app sees the request. The cost is one timer per head and one count per read: no
Python runs per header or per byte. A body that stalls is monitor/api/limits.py's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from email.utils import formatdate
from typing import Any, ClassVar, Final

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from monitor.api.settings import ApiSettings

log = logging.getLogger(__name__)

LINGER_S: Final = 1.0  # after a refusal, how long the client's bytes are still read (and dropped) before the close


class LimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a time and size limit on each request's head (see the module)."""

    header_timeout_s: ClassVar[float]
    max_headers: ClassVar[int]
    max_header_bytes: ClassVar[int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        # Bytes read since the head under way began (at least its size); None while no head is under way.
        self._head_bytes: int | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._time_head()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._stop_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._refused:  # answered and closing: the rest is dropped
            return
        super().data_received(data)
        if self._head_bytes is not None and not self._refused:
            self._head_bytes += len(data)
            if self._head_bytes > self.max_header_bytes:  # a head still growing: refused before it is whole
                self._refuse(431, f"the request's head exceeds {self.max_header_bytes} bytes (api.max_header_bytes)")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if self._head_timer is None:  # the first request's runs from the connection's opening
            self._time_head()

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        self._head_bytes = None
        if len(self.headers) > self.max_headers:
            self._refuse(431, f"the request has more than {self.max_headers} header fields (api.max_headers)")
            return
        # Exact here: a head that came in one read was never counted in data_received.
        if len(self.url) + sum(len(name) + len(value) for name, value in self.headers) > self.max_header_bytes:
            self._refuse(431, f"the request's head exceeds {self.max_header_bytes} bytes (api.max_header_bytes)")
            return
        super().on_headers_complete()

    # The parser goes on through the rest of a read after a refused head: its body belongs to no request.
    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def _time_head(self) -> None:
        if self.header_timeout_s > 0:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._head_bytes is None:
            # Nothing came on a new connection: no request to answer (a 408 here could be read as the answer
            # to the request a client's pool sends on it next).
            self.transport.close()
        else:
            self._refuse(408, f"the request's head did not arrive within {self.header_timeout_s:g} s "
                         "(api.header_timeout_s)")  # fmt: skip

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` in the OpenAI error shape (the head is not read, so neither is the route) and close."""
        self._refused = True
        self._stop_head_timer()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # Pipelined behind a request still being answered: the connection ends with that answer.
            self.cycle.keep_alive = False
            return
        log.warning("refused a request from %s with %d: %s", _address(self.client), status, message)
        error = {"message": message, "type": "invalid_request_error", "code": status}
        body = json.dumps({"error": error}).encode()
        head = [
            STATUS_LINE[status],
            b"date: " + formatdate(usegmt=True).encode() + b"\r\n",
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        if not self.transport.can_write_eof():  # TLS
            self.transport.close()
            return
        # A close with the client's bytes unread resets the connection, which can destroy the answer before the
        # client reads it: the write side ends here, and what still comes is read and dropped (data_received)
        # until the client closes or LINGER_S passes.
        self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


def _address(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown client"


def limited_protocol(api: ApiSettings) -> type[LimitedProtocol]:
    """The protocol class for uvicorn's ``http=`` with ``api``'s limits (uvicorn makes one per connection)."""
    limits = {
        "header_timeout_s": api.header_timeout_s,
        "max_headers": api.max_headers,
        "max_header_bytes": api.max_header_bytes,
    }
    return type("LimitedProtocol", (LimitedProtocol,), limits)
