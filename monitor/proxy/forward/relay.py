"""The relay of a streamed answer: each event passed on as it completes, read once, and the stream's one end.

The end (the record, the upstream request closed, the replica released) runs once however the
stream ends: its last event, a cut upstream, or a client that leaves, even before the first event.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from monitor.proxy.asks import gathered_sglang
from monitor.proxy.encoding import Decoder
from monitor.proxy.forward.events import (
    EventCutter,
    cleaned_sglang_of,
    ends_answer,
    event_data,
    is_done,
    json_object,
    object_of,
    remember,
    usage_only,
)
from monitor.proxy.forward.exchange import Exchange
from monitor.proxy.forward.sparse import SMALL_BYTES
from monitor.proxy.upstream import UpstreamError, UpstreamResponse


class Relay:
    """One relayed event stream and its end (record, close, release), which runs once however the stream ends."""

    def __init__(self, exchange: Exchange, response: UpstreamResponse, applied: list[str] | None) -> None:
        self.exchange = exchange
        self.response = response
        self.decoder = Decoder(applied, exchange.settings.max_body_bytes) if applied else None
        # A coding not read here (an upstream that ignored Accept-Encoding): the bytes pass, unrecorded.
        self.opaque = applied is None
        self.report: dict[str, Any] | None = None
        self.finish: str | None = None
        self.error: str | None = None
        self.limit = exchange.settings.max_event_bytes
        # Why the rest of the stream goes through as it comes, unread (an event past proxy.max_event_bytes), the
        # request counted unrecorded; None while it is read.
        self.passing: str | None = None
        self.events = self._events()

    def settle(self) -> None:
        if self.opaque or self.passing is not None:
            self.exchange.unreadable(self.passing or "the stream's content coding cannot be read")
            return
        if self.error is not None or self.response.status >= 400 or self.report is None:
            self.exchange.record(None, finish=self.finish, error=self.error)
        else:
            self.exchange.record_after_reply(self.report, finish=self.finish)

    async def _settled(self) -> None:
        self.settle()
        await self.exchange.on_disk()

    async def end(self) -> None:
        """Settle as a disconnect unless the stream ended first, then close the upstream request (shielded)."""
        if not self.exchange.settled:
            self.error = self.error or self.exchange.early_end
            self.settle()
        await self.events.aclose()
        self.response.close()

    async def _events(self) -> AsyncGenerator[bytes]:
        """Pass the upstream's events on as each completes; keep the last report and finish reason for the record."""
        cutter = EventCutter()
        try:
            async for raw in self.response.chunks():
                if self.opaque:
                    yield raw
                    continue
                data = self.decoder.feed(raw) if self.decoder is not None else raw
                if self.passing is not None:
                    yield data
                    continue
                for event in cutter.feed(data):
                    if self.passing is None and len(event) > self.limit:
                        self.passing = self._too_large
                    relayed = event if self.passing is not None else await self._read(event)
                    if relayed is not None:
                        yield relayed
                if self.passing is None and cutter.held > self.limit:
                    self.passing = self._too_large
                if self.passing is not None and cutter.held:
                    yield cutter.rest()
            if rest := cutter.rest():
                yield rest
        except (UpstreamError, zlib.error) as cut:
            self.error = f"upstream stream cut: {cut}" if isinstance(cut, UpstreamError) else "stream undecodable"
            await self._settled()  # before the client reads the error event, as before a [DONE]
            message = {"error": {"message": "the upstream's stream was cut short", "type": "upstream_error"}}
            yield f"data: {json.dumps(message)}\n\n".encode()
        except BaseException:  # the client went away (cancellation, a closed generator) or the server stops
            self.error = self.exchange.early_end
            raise
        await self._settled()  # the body's end (a stream without [DONE]) goes out after this

    @property
    def _too_large(self) -> str:
        return f"a streamed event exceeds proxy.max_event_bytes ({self.limit} bytes): the rest passed unread"

    async def _read(self, event: bytes) -> bytes | None:
        """One complete event read for the record: what goes on to the client (None: nothing, it was the proxy's)."""
        exchange = self.exchange
        data = event_data(event)
        if data is None:
            if is_done(event):
                await self._settled()  # before the client reads the end: settled, its record made once the loop is free
            return event
        # A large event (logprobs, SGLang's meta_info) is read off the event loop, its large values left unparsed.
        parsed_event = json_object(data) if len(data) <= SMALL_BYTES else await object_of(data)
        exchange.saw_event(parsed_event)
        before = self.report
        self.report, self.finish = remember(parsed_event, self.report, self.finish)
        if exchange.sglang_added and parsed_event is not None:  # SGLang's counts and usage: two events
            self.report = gathered_sglang(before, parsed_event)
        if ends_answer(parsed_event):  # a client may stop reading here: recorded before it reads
            await self._settled()
        if exchange.strip_usage and usage_only(parsed_event):
            return None
        if not exchange.sglang_added or parsed_event is None:
            return event
        cleaned = await cleaned_sglang_of(data, exchange.sglang_added)
        if cleaned == data:
            return event
        return None if cleaned is None else b"data: " + cleaned + b"\n\n"


class RelayResponse(StreamingResponse):
    """A relayed stream whose end runs whatever happens, also when the client leaves before its first event.

    Then the events' generator never starts, so its ``finally`` would never run: no record, and the
    replica's in-flight count never released.
    """

    def __init__(self, relay: Relay, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        super().__init__(relay.events, status)
        self.raw_headers = headers
        self._relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:
            pass  # settled below, as a disconnect
        finally:
            with anyio.CancelScope(shield=True):
                await self._relay.end()


class ThroughResponse(StreamingResponse):
    """An answer passed on as it arrives, unread: a route not recorded, or a whole answer too large to hold.

    Its end (the upstream's connection closed, the replica released, the request counted unrecorded
    where it is one) runs however the answer ends, as a relayed stream's does.
    """

    def __init__(
        self,
        exchange: Exchange,
        response: UpstreamResponse,
        chunks: AsyncIterator[bytes],
        headers: list[tuple[bytes, bytes]],
        unread: str | None = None,
    ) -> None:
        super().__init__(self._freeing(chunks), response.status)
        self.raw_headers = headers
        self._exchange = exchange
        self._response = response
        self._unread = unread  # why a recorded answer was not read

    async def _freeing(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """``chunks``, the replica released and its connection kept once the upstream's body is all here.

        Before the last piece goes to the client, not after: a client that sends its next request as soon
        as this answer ends (listing the models, then a completion) finds the replica idle, as it is.
        """
        async for chunk in chunks:
            if self._response.complete:
                self._end()
            yield chunk

    def _end(self) -> None:
        """Close the upstream's answer and end the request (once, however often it is called)."""
        self._response.close()
        if self._unread is not None:
            self._exchange.unreadable(self._unread)
        else:
            self._exchange.release()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:
            pass
        finally:
            self._end()
