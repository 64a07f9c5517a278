"""Proxy mode: the sidecar in front of a serving stack, recording every request it forwards.

With ``proxy.upstream`` set (``draftwatch serve --upstream URL``), the stack's endpoints are served
here and forwarded unchanged: method, headers (the client's own ``Authorization`` included), body,
status, error bodies, and server-sent events event by event as they arrive. Per request one
record is made: the workload from the ``X-Workload`` header (not forwarded), else the body's
``metadata.workload``, else the first matching ``proxy.workload_rules`` rule, else
``proxy.default_workload``; TTFT (first streamed event) and latency measured here; tokens and
speculative counts from the stack's own report, read by the same parser as the adapter endpoints
(:mod:`monitor.ingest.stacks`).

A streamed OpenAI-compatible request is asked for its usage (``stream_options.include_usage``),
and the usage-only event the client did not ask for is taken out of its stream. The monitor never
fails a request: a response whose figures cannot be read is forwarded as is and counted in
``draftwatch_proxy_unrecorded_total``; recording goes through the recorder's queue (which spools
when the database is away), or with ``recorder.spool_before_reply`` is fsync'd to the spool before
the answer's last byte, so that a kill -9 loses no answered request. An unreachable upstream
gives 502 and a silent one 504, both in the
OpenAI error shape and recorded as errors; a client that disconnects mid-stream closes the
upstream request, recorded as an error ("client disconnected"), as does one that leaves before the
answer (the engine's request is cancelled); either way the replica's in-flight count is released.

Every header passes, repeated ones included; compressed bodies pass with their ``Content-Encoding``
and are read from a decoded copy (:mod:`monitor.proxy.encoding`). Any path of the engine that is not
one of draftwatch's own route families is forwarded with any method (:class:`ProxyMiddleware`);
only the generations (``RECORDED_PATHS``, POSTed) are recorded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import json
import logging
import math
import re
import time
import uuid
import zlib
from collections.abc import AsyncGenerator, Iterator, Mapping
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from weakref import WeakKeyDictionary

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from decoder.record import LIMITS, WORKLOAD_PATTERN, RequestRecord
from monitor.api.auth import Guard
from monitor.api.errors import ApiError
from monitor.api.events import record_from
from monitor.api.state import ApiState, api_state, offer
from monitor.ingest.capture.rows import proxied_row
from monitor.ingest.stacks import PARSERS, Stack, StackError, reported
from monitor.ingest.stacks.report import StackReport
from monitor.ingest.stacks.sglang import is_sglang_openai
from monitor.proxy.asks import ask_sglang, cleaned_sglang_json, gathered_sglang
from monitor.proxy.encoding import Decoder, accepted_upstream, codings, decoded
from monitor.proxy.models import merged_models
from monitor.proxy.routing import Router
from monitor.proxy.settings import ProxySettings
from monitor.proxy.upstream import (
    UpstreamError,
    UpstreamRefusedError,
    UpstreamResponse,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)

log = logging.getLogger(__name__)

# The OpenAI-compatible endpoints, and the stacks' own (llama.cpp /completion, SGLang /generate).
OPENAI_PATHS: Final = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
NATIVE_PATHS: Final = ("/completion", "/generate")
USAGE_ON_REQUEST: Final = ("/v1/chat/completions", "/v1/completions")
FORWARDED_PATHS: Final = (*OPENAI_PATHS, *NATIVE_PATHS, "/v1/models")
# The generations, recorded when POSTed; anything else the engine serves is forwarded unrecorded.
RECORDED_PATHS: Final = (*OPENAI_PATHS, *NATIVE_PATHS)
# Hop-by-hop headers (RFC 9110 section 7.6.1) and those the HTTP layers recompute. Content-Encoding
# is end to end: a compressed body passes with it (monitor/proxy/encoding.py).
HOP_HEADERS: Final = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host",
     "content-length"}
)  # fmt: skip

PROXY_TOKEN_HEADER: Final = "x-draftwatch-token"

router = APIRouter()


def workload_of(request: Request, payload: Mapping[str, Any] | None, settings: ProxySettings) -> str:
    """The workload of a proxied request: header, then ``metadata.workload``, then the rules, then the default."""
    named = request.headers.get(settings.workload_header)
    metadata = payload.get("metadata") if payload else None
    if not named and isinstance(metadata, dict) and isinstance(metadata.get("workload"), str):
        named = metadata["workload"]
    if named and WORKLOAD_PATTERN.fullmatch(named):
        return named
    values = {"path": request.scope["path"], "model": (payload or {}).get("model"), "user": (payload or {}).get("user")}
    for rule in settings.workload_rules:
        value = values.get(rule.field)
        if isinstance(value, str) and fnmatch.fnmatchcase(value, rule.pattern):
            return rule.workload
    return settings.default_workload


def client_headers(request: Request, settings: ProxySettings) -> list[tuple[bytes, bytes]]:
    """The client's headers for the upstream: every one as sent, repeated ones included, but the sidecar's own."""
    dropped = {*HOP_HEADERS, settings.workload_header.lower(), PROXY_TOKEN_HEADER}
    return [(k, v) for k, v in request.headers.raw if k.decode("latin-1").lower() not in dropped]


def stack_of(kind: str, path: str, report: Mapping[str, Any]) -> Stack | None:
    """Which parser reads the upstream's report: the configured kind, else the report's own shape."""
    if kind in PARSERS:
        return kind  # type: ignore[return-value]
    if kind == "auto":
        if "timings" in report:
            return "llamacpp"
        if "meta_info" in report or path == "/generate" or is_sglang_openai(report):
            return "sglang"
        if "metrics" in report or "usage" in report:
            return "vllm"
    return None


class _Exchange:
    """One proxied request: what was asked, what came back, and the record made of it."""

    def __init__(self, state: ApiState, router: Router, request: Request, body: bytes) -> None:
        self.state = state
        self.settings = state.settings.proxy
        self.path: str = request.scope["path"]
        self.started = datetime.now(UTC)
        self.t0 = time.perf_counter()
        self.ttft_s: float | None = None
        # The stream's first and last events that carried generated text: its decode phase.
        self.first_text_s: float | None = None
        self.last_text_s: float | None = None
        # Generations are recorded; /v1/models, HEAD, OPTIONS and the engine's other routes pass unrecorded.
        self.recording = request.method == "POST" and self.path in RECORDED_PATHS
        self._recorded = False
        # The record's fsync to the spool, under recorder.spool_before_reply: the answer ends only after it.
        self._on_disk: Future[bool] | None = None
        # A compressed body goes upstream as it came; its fields are read from a decoded copy.
        encoding = request.headers.get("content-encoding", "")
        readable = decoded(body, encoding, self.settings.max_body_bytes) if encoding else body
        self.payload = _json_object(readable) if readable is not None else None
        self.workload = workload_of(request, self.payload, self.settings)
        model = (self.payload or {}).get("model")
        self.route = router.choose(self.workload, model) if self.recording else router.passing(model)
        # Read as its deployment's kind says ([[proxy.routes]] kind).
        self.settings = self.route.deployment.settings
        # One name for the deployment whichever pool answers: SGLang's /generate names no model.
        self.upstream_host = self.route.deployment.name
        self.inflight = self.route.member.acquire()
        self._released = False
        self._moved = False
        self.streamed = bool(self.recording and self.payload and self.payload.get("stream") is True)
        # SGLang's OpenAI routes report the counts only when asked (monitor/proxy/asks.py); the answer is cleaned.
        self.sglang_added = frozenset[str]()
        if self.settings.kind == "sglang" and self.recording and self.payload is not None:
            self.sglang_added = ask_sglang(self.payload, self.path)
        self._original = body
        # What goes upstream if the engine refuses the stream_options added below.
        self._without_usage = json.dumps(self.payload).encode() if self.sglang_added else body
        self.strip_usage = False
        # Chat and completions streams carry usage only when asked; a Responses stream always ends with it.
        member = self.route.member
        if self.streamed and self.path in USAGE_ON_REQUEST and self.payload is not None and member.takes_stream_options:
            options = self.payload.get("stream_options")
            options = options if isinstance(options, dict) else {}
            if options.get("include_usage") is not True:
                self.payload["stream_options"] = {**options, "include_usage": True}
                self.strip_usage = True
        self.body = json.dumps(self.payload).encode() if self.strip_usage else self._without_usage
        self._client_headers = client_headers(request, self.settings)
        self.headers = self._headers_for(self.body)

    def _headers_for(self, body: bytes) -> list[tuple[bytes, bytes]]:
        """The client's headers for ``body``: one rewritten here goes as identity, whatever its coding was."""
        headers = []
        for name, value in self._client_headers:
            lowered = name.lower()
            if lowered == b"content-encoding" and body is not self._original:
                continue
            if lowered == b"accept-encoding":
                # A stream is decoded here event by event anyway, and an engine's compressor may hold events back.
                accepted = "identity" if self.streamed else accepted_upstream(value.decode("latin-1"))
                value = accepted.encode("latin-1")
            headers.append((name, value))
        return headers

    def refused_stream_options(self, status: int, content_encoding: str, content: bytes) -> bool:
        """Whether the engine refused the ``stream_options`` added here (a 400 naming it): the body then goes without.

        The replica is not asked again; its streams are recorded from what they carry (llama.cpp's
        timings), or counted as unrecorded.
        """
        if status != 400 or not self.strip_usage:
            return False
        if b"stream_options" not in (decoded(content, content_encoding, self.settings.max_body_bytes) or b""):
            return False
        member = self.route.member
        member.takes_stream_options = False
        log.warning("upstream %s refused stream_options (400): its streams are no longer asked for usage",
                    member.upstream.netloc)  # fmt: skip
        self.strip_usage = False
        self.body = self._without_usage
        self.headers = self._headers_for(self.body)
        return True

    @property
    def settled(self) -> bool:
        return self._recorded

    def unreadable(self, why: str) -> None:
        """A response forwarded whole but not readable here (a content coding not decoded): counted as unrecorded."""
        if self._recorded:
            return
        self._recorded = True
        self.release()
        if self.recording:
            self.state.proxy_unrecorded += 1
            log.warning("proxied %s not recorded: %s", self.path, why)

    def release(self) -> None:
        """The request left its replica: one fewer in flight there (once, whichever path ends it)."""
        if not self._released:
            self._released = True
            self.route.member.release()

    def moved(self) -> bool:
        """Take another replica of the same pool after this one refused the connection; False when there is none.

        Nothing reached the refusing replica, so the request cannot run twice; it moves once only,
        and the refusal still counts towards that replica's health (:meth:`Member.send`).
        """
        refused = self.route.member
        pool = self.route.deployment.speculative if refused.pool == "speculative" else self.route.deployment.baseline
        others = [m for m in pool.members if m is not refused]
        if self._moved or not others:
            return False
        self._moved = True
        self.release()
        self.route = dataclasses.replace(self.route, member=pool.pick(others))
        self.inflight = self.route.member.acquire()
        self._released = False
        log.info("upstream %s refused the connection; the request goes to %s", refused.upstream.netloc,
                 self.route.member.upstream.netloc)  # fmt: skip
        return True

    def saw_event(self, event: Mapping[str, Any] | None) -> None:
        now = time.perf_counter() - self.t0
        if self.ttft_s is None:
            self.ttft_s = now
        if event is not None and _carries_text(event):
            if self.first_text_s is None:
                self.first_text_s = now
            self.last_text_s = now

    def record(self, report: Mapping[str, Any] | None, *, finish: str | None = None, error: str | None = None) -> None:
        """Hand the record of this request to the recorder, once; a report the parser refuses is counted, not stored."""
        if self._recorded:  # an abandoned request may end on two paths at once: one record
            return
        self._recorded = True
        self.release()
        if not self.recording:
            return
        ended = self.started + timedelta(seconds=time.perf_counter() - self.t0)
        fields = {
            "workload": self.workload,
            "ts_start": self.started,
            "ts_end": ended,
            # SGLang's /generate names no model: the deployment's address stands in for it.
            "target_model": (self.payload or {}).get("model") or f"{self.settings.kind}@{self.upstream_host}",
            "drafter": "upstream",
            "temperature": _number((self.payload or {}).get("temperature"), "temperature", 0.0),
            "top_p": _number((self.payload or {}).get("top_p"), "top_p", 1.0),
        }
        try:
            if report is None or error is not None:
                rec = self._failure(fields, error or "the upstream's response carried no report")
            else:
                rec = self._success(fields, report, finish)
            if self.state.settings.recorder.spool_before_reply:
                self._on_disk = self.state.recorder.record_durable(rec)
            else:
                self.state.recorder.record_nowait(rec)
        except (StackError, ApiError, ValueError) as refused:
            self.state.proxy_unrecorded += 1
            # The reason names fields and counts only: no body, no header, no token.
            log.warning("proxied %s not recorded: %s", self.path, _reason(refused))

    async def on_disk(self) -> None:
        """Wait, off the event loop, until the record is fsync'd to the spool (recorder.spool_before_reply).

        Awaited before the answer's last byte goes out, so that a client holding a whole answer has
        its record survive a kill -9 of the sidecar. At once when the setting is off.
        """
        if self._on_disk is not None:
            await asyncio.wrap_future(self._on_disk)

    def _success(self, fields: dict[str, Any], report: Mapping[str, Any], finish: str | None) -> RequestRecord:
        stack = stack_of(self.settings.kind, self.path, report)
        if stack is None:
            raise ValueError(f"proxy.kind={self.settings.kind!r}: the response carries no usage to record")
        self.route.member.stack = stack
        baseline = self.route.baseline
        parsed = PARSERS[stack](report, speculative=False if baseline else self.settings.deployment_speculative)
        if baseline and parsed.drafted:
            raise ValueError(
                f"the baseline upstream {self.route.member.upstream.netloc} drafted {parsed.drafted} tokens: "
                "proxy.baseline_upstream must serve the model without speculation"
            )
        return self._built(fields, parsed, finish=parsed.finish_reason or finish)

    def _failure(self, fields: dict[str, Any], error: str) -> RequestRecord:
        return self._built(fields, None, finish="error", error=error[:200])

    def _built(
        self, fields: dict[str, Any], parsed: StackReport | None, *, finish: str | None, error: str | None = None
    ) -> RequestRecord:
        """The record of an answered request (``parsed``: the stack's report) or a failed one (None): one shape.

        Both take their times from one reading of the clock (``fields``' ts_start and ts_end, whose
        difference is the latency), their mode from the routing (the baseline's requests are held
        out; a failed one keeps the deployment's mode) and go through the record's contract as every
        entrance does (:func:`monitor.api.events.record_from`).
        """
        latency_ms = (fields["ts_end"] - fields["ts_start"]) / timedelta(milliseconds=1)
        ttft_ms = None if self.ttft_s is None else self.ttft_s * 1000
        if parsed is not None and not self.streamed and parsed.ttft_ms is not None:
            # A non-streamed response arrives whole: the stack's own TTFT is the only one there is.
            ttft_ms = parsed.ttft_ms
        deployed = "speculative" if self.settings.deployment_speculative else "plain"
        return record_from(
            {
                **fields,
                "request_id": (parsed and parsed.request_id) or _new_id(),
                **(reported(parsed) if parsed else {}),
                "mode": "holdout" if self.route.baseline else (parsed.mode if parsed else deployed),
                "holdout_reason": self.route.holdout_reason,
                "ttft_ms": ttft_ms,
                "latency_ms": latency_ms,
                "decode_ms": self._decode_ms(parsed) if parsed else None,
                "upstream_inflight": self.inflight,
                "finish_reason": finish,
                "error": error,
                "source": f"proxy:{self._stack_named()}",
            },
            ("response",),
        )

    def _decode_ms(self, parsed: StackReport) -> float | None:
        """The engine's own decode time where it reports one, else the stream's; a whole answer has none.

        A non-streamed response without engine timings arrives in one piece: its latency holds queueing
        and prompt reading, which would be taken for decoding, so it has no decode time at all.
        """
        if parsed.ttft_ms is not None and parsed.latency_ms is not None:
            return max(parsed.latency_ms - parsed.ttft_ms, 0.0)
        if self.streamed and self.first_text_s is not None and self.last_text_s is not None:
            return (self.last_text_s - self.first_text_s) * 1000
        return None

    def _stack_named(self) -> str:
        """The configured stack; with proxy.kind auto, the one this replica's answers were last read as (else auto)."""
        return (self.settings.kind == "auto" and self.route.member.stack) or self.settings.kind


# Whom a refused token is answered as, in the OpenAI error's type.
_AUTH_ERRORS: Final = {401: "authentication_error", 403: "permission_error"}


class _CutShortError(UpstreamError):
    """The upstream stopped in the middle of a whole (non-streamed) body."""


async def forward(request: Request) -> Response:
    state = api_state(request)
    router = state.router
    if router is None:  # the route exists only in proxy mode
        raise ApiError(503, "proxy_off", "proxy mode is off: start the sidecar with --upstream URL")
    if state.tokens.has_scope("proxy"):
        # The client's own Authorization belongs to the upstream: draftwatch's token comes apart.
        presented = request.headers.get(PROXY_TOKEN_HEADER)
        try:
            Guard("proxy").check(request, presented, how="X-Draftwatch-Token: <token of scope proxy>")
        except ApiError as refused:  # in the shape the engine's clients parse
            kind = _AUTH_ERRORS.get(refused.status, "invalid_request_error")
            return openai_error(refused.status, refused.message, kind, refused.code, refused.headers)
    if router.routes and request.method == "GET" and request.scope["path"] == "/v1/models":
        return await _merged_models(request, state.settings.proxy, router)
    exchange = _Exchange(state, router, request, await request.body())
    response: Response | None = None
    left = False
    task = asyncio.current_task()
    assert task is not None

    async def watch() -> None:
        # The body is read: the next message is the client leaving. Cancelling the upstream request
        # closes its connection, which is what stops the engine generating for nobody. A plain task
        # and Task.cancel: anyio's task group and cancel scope cost a tenth of a proxied request.
        nonlocal left
        while (await request.receive())["type"] != "http.disconnect":
            pass
        left = True
        task.cancel()

    # Only the awaits below can be interrupted: the watcher is cancelled before any other.
    watcher = asyncio.ensure_future(watch())
    try:
        response = await _answer(request, exchange)
        await exchange.on_disk()  # a whole answer: its body is sent after this
    except asyncio.CancelledError:
        if not left:  # the server stops
            raise
        task.uncancel()
    except Exception:
        exchange.record(None, error="the proxy failed (see its log)")
        raise
    finally:
        watcher.cancel()
        if response is None:  # the client left (or the server stops) before the answer came
            exchange.record(None, error="client disconnected")
    # The client left: nobody reads this (499, nginx's "client closed request").
    return Response(status_code=499) if response is None else response


async def _merged_models(request: Request, settings: ProxySettings, router: Router) -> Response:
    """Every deployment's models in one list (monitor/proxy/models.py); 502 when none answered."""
    merged = await merged_models(router.deployments, client_headers(request, settings), settings.max_body_bytes)
    if merged is None:
        return openai_error(502, "no upstream answered /v1/models", "upstream_unavailable")
    return JSONResponse(merged)


async def _answer(request: Request, exchange: _Exchange) -> Response:
    """The upstream's answer to one request, as the client gets it; recorded, or handed to the relay that records it."""
    try:
        response, content = await _send(request, exchange)
    except UpstreamTimeoutError:
        exchange.record(None, error="upstream timed out")
        silence = f"the upstream sent nothing within {exchange.settings.timeout_s:g} s"
        return openai_error(504, silence, "upstream_timeout")
    except _CutShortError as error:
        exchange.record(None, error=f"upstream response cut: {error}")
        return openai_error(502, "the upstream's response was cut short", "upstream_unavailable")
    except UpstreamUnavailableError as error:
        exchange.record(None, error=f"upstream unreachable: {error}")
        netloc = exchange.route.member.upstream.netloc
        return openai_error(502, f"the upstream at {netloc} cannot be reached ({error})",
                            "upstream_unavailable")  # fmt: skip
    if exchange.recording and response.status < 400:  # a request the upstream refused is no traffic to evaluate on
        offer(request, lambda: proxied_row(exchange.path, exchange.payload, exchange.workload))
    coding = response.header("content-encoding")
    if content is None:
        relay = _Relay(exchange, response, codings(coding))
        # Read event by event, a stream is decoded here and goes on as identity (an unknown coding passes as is).
        return _RelayResponse(relay, response.status, _headers_out(response, decoded=relay.decoder is not None))
    head = request.method == "HEAD"
    headers = _headers_out(response, decoded=False, keep_length=head)
    readable = decoded(content, coding, exchange.settings.max_body_bytes)
    report = None if readable is None else _json_object(readable)
    if readable is None:
        exchange.unreadable(f"the response's content coding {coding!r} cannot be read")
    elif response.status >= 400 or report is None:
        exchange.record(None, error=f"upstream status {response.status}")
    else:
        exchange.record(report)
        cleaned = cleaned_sglang_json(readable, exchange.sglang_added)
        if cleaned is not None and cleaned != readable:  # rewritten here: it goes as identity
            content, headers = cleaned, _headers_out(response, decoded=True)
    return _whole(b"" if head else content, response.status, headers, head=head)


async def _send(request: Request, exchange: _Exchange) -> tuple[UpstreamResponse, bytes | None]:
    """The upstream's answer: an event stream still to relay (None), or a whole body, read and closed."""
    query = request.scope["query_string"]
    target = exchange.path.encode() + (b"?" + query if query else b"")
    while True:
        try:
            response = await exchange.route.member.send(request.method, target, exchange.headers, exchange.body)
        except UpstreamRefusedError:
            if exchange.moved():
                continue
            raise
        if response.header("content-type").startswith("text/event-stream"):
            return response, None
        try:
            content = await response.read()
        except UpstreamTimeoutError:
            raise
        except UpstreamError as error:
            raise _CutShortError(str(error)) from None
        finally:
            response.close()
        # A refused stream_options goes again once without it (a 400: nothing was generated).
        if not exchange.refused_stream_options(response.status, response.header("content-encoding"), content):
            return response, content


def _headers_out(response: UpstreamResponse, *, decoded: bool, keep_length: bool = False) -> list[tuple[bytes, bytes]]:
    """The upstream's headers for the client, repeated ones included; a body decoded here loses its coding."""
    dropped = HOP_HEADERS - {"content-length"} if keep_length else HOP_HEADERS
    return [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.headers
        if name.lower() not in dropped and not (decoded and name.lower() == "content-encoding")
    ]


def _whole(content: bytes, status: int, headers: list[tuple[bytes, bytes]], *, head: bool) -> Response:
    response = Response(content, status)
    # A HEAD answer keeps the upstream's Content-Length (of the body it did not send).
    response.raw_headers = [*headers, *([] if head else response.raw_headers)]
    return response


class _Relay:
    """One relayed event stream and its end (record, close, release), which runs once however the stream ends."""

    def __init__(self, exchange: _Exchange, response: UpstreamResponse, applied: list[str] | None) -> None:
        self.exchange = exchange
        self.response = response
        self.decoder = Decoder(applied, exchange.settings.max_body_bytes) if applied else None
        # A coding not read here (an upstream that ignored Accept-Encoding): the bytes pass, unrecorded.
        self.opaque = applied is None
        self.report: dict[str, Any] | None = None
        self.finish: str | None = None
        self.error: str | None = None
        self.events = self._events()

    def settle(self) -> None:
        if self.opaque:
            self.exchange.unreadable("the stream's content coding cannot be read")
            return
        failed = self.error is not None or self.response.status >= 400 or self.report is None
        self.exchange.record(None if failed else self.report, finish=self.finish, error=self.error)

    async def _settled(self) -> None:
        self.settle()
        await self.exchange.on_disk()

    async def end(self) -> None:
        """Settle as a disconnect unless the stream ended first, then close the upstream request (shielded)."""
        if not self.exchange.settled:
            self.error = self.error or "client disconnected"
            self.settle()
        await self.events.aclose()
        self.response.close()

    async def _events(self) -> AsyncGenerator[bytes]:
        """Pass the upstream's events on as each completes; keep the last report and finish reason for the record."""
        exchange = self.exchange
        pending = b""
        try:
            async for raw in self.response.chunks():
                if self.opaque:
                    yield raw
                    continue
                pending += self.decoder.feed(raw) if self.decoder is not None else raw
                while (end := _event_end(pending)) is not None:
                    event, pending = pending[:end], pending[end:]
                    data = _event_data(event)
                    if data is not None:
                        parsed_event = _json_object(data)
                        exchange.saw_event(parsed_event)
                        before = self.report
                        self.report, self.finish = _remember(parsed_event, self.report, self.finish)
                        if exchange.sglang_added and parsed_event is not None:  # SGLang's counts and usage: two events
                            self.report = gathered_sglang(before, parsed_event)
                        if _ends_answer(parsed_event):  # a client may stop reading here: recorded before it reads
                            await self._settled()
                        if exchange.strip_usage and _usage_only(parsed_event):
                            continue
                        cleaned = cleaned_sglang_json(data, exchange.sglang_added) if exchange.sglang_added else data
                        if cleaned != data:
                            if cleaned is None:
                                continue
                            event = b"data: " + cleaned + b"\n\n"
                    elif _is_done(event):
                        await self._settled()  # before the client reads the end: what it has seen is recorded by then
                    yield event
            if pending:
                yield pending
        except (UpstreamError, zlib.error) as cut:
            self.error = f"upstream stream cut: {cut}" if isinstance(cut, UpstreamError) else "stream undecodable"
            await self._settled()  # before the client reads the error event, as before a [DONE]
            message = {"error": {"message": "the upstream's stream was cut short", "type": "upstream_error"}}
            yield f"data: {json.dumps(message)}\n\n".encode()
        except BaseException:  # the client went away (cancellation, a closed generator) or the server stops
            self.error = "client disconnected"
            raise
        await self._settled()  # the body's end (a stream without [DONE]) goes out after this


class _RelayResponse(StreamingResponse):
    """A relayed stream whose end runs whatever happens, also when the client leaves before its first event.

    Then the events' generator never starts, so its ``finally`` would never run: no record, and the
    replica's in-flight count never released.
    """

    def __init__(self, relay: _Relay, status: int, headers: list[tuple[bytes, bytes]]) -> None:
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


def _reason(refused: Exception) -> str:
    """Why a report was not recorded: the fields at fault and what is wrong with them, never their values."""
    if isinstance(refused, ApiError) and refused.detail:
        return "; ".join(f"{'.'.join(map(str, p.loc))}: {p.msg}" for p in refused.detail)[:500]
    return str(refused).splitlines()[0][:500]


def _remember(
    event: dict[str, Any] | None, report: dict[str, Any] | None, finish: str | None
) -> tuple[dict[str, Any] | None, str | None]:
    if event is None:
        return report, finish
    if event.get("type") == "response.completed" and isinstance(event.get("response"), dict):
        return event["response"], finish  # a Responses stream's last event holds the whole response
    choices = event.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                finish = choice["finish_reason"]
    # The event that carries the figures: usage (OpenAI), timings (llama.cpp), meta_info (SGLang). A chunk
    # with "usage": null (vLLM writes it on every chunk but the last when usage was asked for) is not one.
    carries = any(key in event for key in ("usage", "timings", "meta_info", "metrics"))
    if carries and not ("usage" in event and event["usage"] is None):
        report = event
    return report, finish


def _carries_text(event: Mapping[str, Any]) -> bool:
    """Does a streamed event carry generated text? A role-only first chunk or ``response.created`` does not."""
    if event.get("type") == "response.output_text.delta":  # Responses
        return bool(event.get("delta"))
    choices = event.get("choices")
    if isinstance(choices, list):  # chat (delta.content, delta.reasoning_content) and completions (text)
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")):
                return True
            if choice.get("text"):
                return True
        return False
    # llama.cpp's /completion and SGLang's /generate stream the text itself.
    return bool(event.get("content") or event.get("text"))


def _ends_answer(event: Mapping[str, Any] | None) -> bool:
    """The last event of a stream without ``[DONE]``: Responses' ``response.completed``, llama.cpp's ``stop``."""
    return event is not None and (event.get("type") == "response.completed" or event.get("stop") is True)


def _usage_only(event: Mapping[str, Any] | None) -> bool:
    """The usage chunk asked for here (no choices): read from the event already parsed, not parsed again."""
    return event is not None and event.get("choices") == [] and "usage" in event


def _event_end(buffer: bytes) -> int | None:
    """The end of the first complete event in ``buffer`` (after its blank line), or None."""
    ends = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n") if (i := buffer.find(sep)) >= 0]
    return min(ends) if ends else None


def _event_data(event: bytes) -> bytes | None:
    """The joined ``data:`` lines of one event; None for comments, keep-alives and ``[DONE]``."""
    lines = [line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:")]
    data = b"\n".join(lines)
    return None if not lines or data.strip() == b"[DONE]" else data


def _is_done(event: bytes) -> bool:
    return any(line.startswith(b"data:") and line[5:].strip() == b"[DONE]" for line in event.splitlines())


def _json_object(content: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _number(value: Any, field: str, default: float) -> float:
    """The client's ``field`` for the record where the record's bounds take it, else the default."""
    limit = LIMITS[field]
    low = -math.inf if limit.ge is None else limit.ge
    high = math.inf if limit.le is None else limit.le
    if isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high:
        return float(value)
    return default


def _new_id() -> str:
    return f"proxy-{uuid.uuid4().hex}"


def openai_error(
    status: int, message: str, kind: str, code: str | int | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """An error in the OpenAI shape, which the clients of every stack parse (draftwatch's own shape they do not)."""
    body = {"error": {"message": message, "type": kind, "code": status if code is None else code}}
    return JSONResponse(body, status, headers=dict(headers or {}))


# Per app: the paths draftwatch serves itself, which are never forwarded.
_OWN_PATHS: WeakKeyDictionary[Any, re.Pattern[str]] = WeakKeyDictionary()


def proxied(scope: Scope) -> bool:
    """Whether a request in proxy mode is the engine's (forwarded) rather than one of draftwatch's own routes.

    Draftwatch's are its routes' families (``/v1/workloads`` and all under it, ``/metrics``, ...),
    whatever the method; everything else an engine may serve (embeddings, audio, rerank, tokenize,
    its health) is forwarded.
    """
    app = scope.get("app")
    if app is None:
        return False
    own = _OWN_PATHS.get(app)
    if own is None:
        own = _OWN_PATHS[app] = _own_paths(app.routes)
    return own.fullmatch(scope["path"]) is None


def _routes(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every route with its full path, through the routers FastAPI keeps included (not copied) in the app."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _routes(included.routes, prefix + getattr(route.include_context, "prefix", ""))
        elif isinstance(getattr(route, "path", None), str):
            yield prefix + route.path, route


def _own_paths(routes: list[Any]) -> re.Pattern[str]:
    prefixes = set()
    for path, route in _routes(routes):
        if getattr(route, "endpoint", None) is forward:
            continue
        segments = path.strip("/").split("/")
        # /v1/NAME and all under it; a top-level /NAME (/metrics, /healthz) and all under it.
        family = segments[:2] if segments[0] == "v1" and len(segments) > 1 else segments[:1]
        if any("{" in segment for segment in family) or not family[0]:
            prefixes.add(compile_path(path)[0].pattern.removeprefix("^").removesuffix("$"))  # that route alone
            continue
        prefixes.add(re.escape("/" + "/".join(family)))
    return re.compile(f"(?:{'|'.join(sorted(prefixes))})(?:/.*)?")


class ProxyMiddleware:
    """Proxy mode's dispatch: any path but draftwatch's own, with any method, is the engine's and is forwarded.

    Ahead of the routes, so that a method the documented routes do not take (HEAD, OPTIONS) and the
    engine's other routes (embeddings, audio, rerank, tokenize, its health) reach it too; only the
    generations are recorded.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not proxied(scope):
            await self.app(scope, receive, send)
            return
        response = await forward(Request(scope, receive, send))
        await response(scope, receive, send)


for _path in FORWARDED_PATHS:
    router.add_api_route(
        _path,
        forward,
        methods=["GET"] if _path == "/v1/models" else ["POST"],
        summary=f"pass-through {_path} (proxy mode)",
        description="Forwarded to proxy.upstream unchanged, body and response alike; recorded as one request.",
        tags=["proxy"],
    )
