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
when the database is away). An unreachable upstream gives 502 and a silent one 504, both in the
OpenAI error shape and recorded as errors; a client that disconnects mid-stream closes the
upstream request, recorded as an error ("client disconnected").
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from decoder.record import WORKLOAD_PATTERN, Mode, RequestRecord
from monitor.api.adapters import AdapterFields, record_of
from monitor.api.auth import Guard
from monitor.api.capture import offer, proxied_row
from monitor.api.errors import ApiError
from monitor.api.state import ApiState, api_state
from monitor.ingest.stacks import PARSERS, Stack, StackError
from monitor.ingest.stacks.report import StackReport
from monitor.ingest.stacks.sglang import is_sglang_openai
from monitor.proxy.asks import ask_sglang, cleaned_sglang_json, gathered_sglang
from monitor.proxy.routing import Router
from monitor.proxy.settings import ProxySettings
from monitor.proxy.upstream import UpstreamError, UpstreamResponse, UpstreamTimeoutError, UpstreamUnavailableError

log = logging.getLogger(__name__)

# The OpenAI-compatible endpoints, and the stacks' own (llama.cpp /completion, SGLang /generate).
OPENAI_PATHS: Final = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
NATIVE_PATHS: Final = ("/completion", "/generate")
USAGE_ON_REQUEST: Final = ("/v1/chat/completions", "/v1/completions")
FORWARDED_PATHS: Final = (*OPENAI_PATHS, *NATIVE_PATHS, "/v1/models")
# Hop-by-hop headers (RFC 9110 section 7.6.1) and those the HTTP layers recompute.
HOP_HEADERS: Final = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host",
     "content-length", "content-encoding"}
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
    values = {"path": request.url.path, "model": (payload or {}).get("model"), "user": (payload or {}).get("user")}
    for rule in settings.workload_rules:
        value = values.get(rule.field)
        if isinstance(value, str) and fnmatch.fnmatchcase(value, rule.pattern):
            return rule.workload
    return settings.default_workload


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
        self.path = request.url.path
        # One name for the deployment whichever pool answers: SGLang's /generate names no model.
        self.upstream_host = router.speculative.members[0].upstream.netloc
        self.started = datetime.now(UTC)
        self.t0 = time.perf_counter()
        self.ttft_s: float | None = None
        # The stream's first and last events that carried generated text: its decode phase.
        self.first_text_s: float | None = None
        self.last_text_s: float | None = None
        self.payload = _json_object(body)
        self.workload = workload_of(request, self.payload, self.settings)
        self.route = router.for_models() if self.path == "/v1/models" else router.choose(self.workload)
        self.inflight = self.route.member.acquire()
        self._released = False
        self.streamed = bool(self.payload and self.payload.get("stream") is True)
        self.strip_usage = False
        # Chat and completions streams carry usage only when asked; a Responses stream always ends with it.
        if self.streamed and self.path in USAGE_ON_REQUEST and self.payload is not None:
            options = self.payload.get("stream_options")
            options = options if isinstance(options, dict) else {}
            if options.get("include_usage") is not True:
                self.payload["stream_options"] = {**options, "include_usage": True}
                body = json.dumps(self.payload).encode()
                self.strip_usage = True
        # SGLang's OpenAI routes report the counts only when asked (monitor/proxy/asks.py); the answer is cleaned.
        self.sglang_added = frozenset[str]()
        if self.settings.kind == "sglang" and self.payload is not None:
            self.sglang_added = ask_sglang(self.payload, self.path)
            body = json.dumps(self.payload).encode() if self.sglang_added else body
        self.body = body
        self.headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in HOP_HEADERS
            and k.lower() not in (self.settings.workload_header.lower(), PROXY_TOKEN_HEADER)
        }

    def release(self) -> None:
        """The request left its replica: one fewer in flight there (once, whichever path ends it)."""
        if not self._released:
            self._released = True
            self.route.member.release()

    def saw_event(self, event: Mapping[str, Any] | None) -> None:
        now = time.perf_counter() - self.t0
        if self.ttft_s is None:
            self.ttft_s = now
        if event is not None and _carries_text(event):
            if self.first_text_s is None:
                self.first_text_s = now
            self.last_text_s = now

    def record(self, report: Mapping[str, Any] | None, *, finish: str | None = None, error: str | None = None) -> None:
        """Hand the record of this request to the recorder; a report the parser refuses is counted, not stored."""
        self.release()
        if self.path == "/v1/models":
            return
        ended = self.started + timedelta(seconds=time.perf_counter() - self.t0)
        fields = {
            "workload": self.workload,
            "ts_start": self.started,
            "ts_end": ended,
            # SGLang's /generate names no model: the deployment's address stands in for it.
            "target_model": (self.payload or {}).get("model") or f"{self.settings.kind}@{self.upstream_host}",
            "drafter": "upstream",
            "temperature": _number((self.payload or {}).get("temperature"), 0.0, 0, 100),
            "top_p": _number((self.payload or {}).get("top_p"), 1.0, 0, 1),
        }
        try:
            if report is None or error is not None:
                rec = self._failure(fields, error or "the upstream's response carried no report")
            else:
                rec = self._success(fields, report, finish)
            self.state.recorder.record_nowait(rec)
        except (StackError, ApiError, ValueError) as refused:
            self.state.proxy_unrecorded += 1
            # The reason names fields and counts only: no body, no header, no token.
            log.warning("proxied %s not recorded: %s", self.path, _reason(refused))

    def _success(self, fields: dict[str, Any], report: Mapping[str, Any], finish: str | None) -> RequestRecord:
        stack = stack_of(self.settings.kind, self.path, report)
        if stack is None:
            raise ValueError(f"proxy.kind={self.settings.kind!r}: the response carries no usage to record")
        baseline = self.route.baseline
        parsed = PARSERS[stack](report, speculative=False if baseline else self.settings.deployment_speculative)
        if baseline and parsed.drafted:
            raise ValueError(
                f"the baseline upstream {self.route.member.upstream.netloc} drafted {parsed.drafted} tokens: "
                "proxy.baseline_upstream must serve the model without speculation"
            )
        latency = time.perf_counter() - self.t0
        measured = dataclasses.replace(
            parsed,
            ttft_ms=None if self.ttft_s is None else self.ttft_s * 1000,
            latency_ms=latency * 1000,
            ts_start=None,
            ts_end=None,
        )
        if not self.streamed and parsed.ttft_ms is not None:
            # A non-streamed response arrives whole: the stack's own TTFT is the only one there is.
            measured = dataclasses.replace(measured, ttft_ms=parsed.ttft_ms)
        extra = {"finish_reason": finish} if finish and parsed.finish_reason is None else {}
        adapter = AdapterFields.model_validate({**fields, "request_id": parsed.request_id or _new_id(), **extra})
        rec = record_of(adapter, measured, ("response",))
        return dataclasses.replace(
            rec,
            mode="holdout" if baseline else rec.mode,
            holdout_reason=self.route.holdout_reason,
            decode_ms=self._decode_ms(parsed),
            upstream_inflight=self.inflight,
        ).check()

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

    def _failure(self, fields: dict[str, Any], error: str) -> RequestRecord:
        spec_mode: Mode = "speculative" if self.settings.speculative == "true" else "plain"
        return RequestRecord(
            request_id=_new_id(),
            ts_start=fields["ts_start"],
            ts_end=fields["ts_end"],
            workload=self.workload,
            target_model=fields["target_model"],
            drafter="upstream",
            # A failed request keeps the mode its routing chose.
            mode="holdout" if self.route.baseline else spec_mode,
            holdout_reason=self.route.holdout_reason,
            upstream_inflight=self.inflight,
            ttft_ms=None if self.ttft_s is None else self.ttft_s * 1000,
            latency_ms=(time.perf_counter() - self.t0) * 1000,
            finish_reason="error",
            error=error[:200],
            source=f"proxy:{self.settings.kind}",
        ).check()


async def forward(request: Request) -> Response:
    state = api_state(request)
    router = state.router
    if router is None:  # the route exists only in proxy mode
        raise ApiError(503, "proxy_off", "proxy mode is off: start the sidecar with --upstream URL")
    if state.tokens.has_scope("proxy"):
        # The client's own Authorization belongs to the upstream: draftwatch's token comes apart.
        presented = request.headers.get(PROXY_TOKEN_HEADER)
        Guard("proxy").check(request, presented, how="X-Draftwatch-Token: <token of scope proxy>")
    exchange = _Exchange(state, router, request, await request.body())
    upstream = exchange.route.member.upstream
    target = request.url.path.encode() + (b"?" + request.url.query.encode() if request.url.query else b"")
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in exchange.headers.items()]
    try:
        response = await upstream.send(request.method, target, headers, exchange.body)
    except UpstreamTimeoutError:
        exchange.record(None, error="upstream timed out")
        return _upstream_error(504, f"the upstream sent nothing within {exchange.settings.timeout_s:g} s")
    except UpstreamUnavailableError as error:
        exchange.record(None, error=f"upstream unreachable: {error}")
        return _upstream_error(502, f"the upstream at {upstream.netloc} cannot be reached ({error})")
    if response.status < 400:  # a request the upstream refused is no traffic to evaluate on
        offer(request, lambda: proxied_row(exchange.path, exchange.payload, exchange.workload))
    headers_out = {k: v for k, v in response.headers if k.lower() not in HOP_HEADERS}
    if response.header("content-type").startswith("text/event-stream"):
        return StreamingResponse(_relay(exchange, response), response.status, headers_out)
    try:
        content = await response.read()
    except UpstreamError as error:
        exchange.record(None, error=f"upstream response cut: {error}")
        return _upstream_error(502, "the upstream's response was cut short")
    finally:
        await response.aclose()
    report = _json_object(content)
    if response.status >= 400 or report is None:
        exchange.record(None, error=f"upstream status {response.status}")
    else:
        exchange.record(report)
        content = cleaned_sglang_json(content, exchange.sglang_added) or content
    return Response(content, response.status, headers_out)


async def _relay(exchange: _Exchange, response: UpstreamResponse) -> AsyncIterator[bytes]:
    """Pass the upstream's events on as each completes; keep the last report and finish reason for the record."""
    report: dict[str, Any] | None = None
    finish: str | None = None
    error: str | None = None
    recorded = False
    pending = b""

    def settle() -> None:
        nonlocal recorded
        if not recorded:
            recorded = True
            failed = error is not None or response.status >= 400 or report is None
            exchange.record(None if failed else report, finish=finish, error=error)

    try:
        async for chunk in response.chunks():
            pending += chunk
            while (end := _event_end(pending)) is not None:
                event, pending = pending[:end], pending[end:]
                data = _event_data(event)
                if data is not None:
                    parsed_event = _json_object(data)
                    exchange.saw_event(parsed_event)
                    before = report
                    report, finish = _remember(parsed_event, report, finish)
                    if exchange.sglang_added and parsed_event is not None:  # SGLang's counts and usage: two events
                        report = gathered_sglang(before, parsed_event)
                    if exchange.strip_usage and _usage_only(data):
                        continue
                    if exchange.sglang_added and (cleaned := cleaned_sglang_json(data, exchange.sglang_added)) != data:
                        if cleaned is None:
                            continue
                        event = b"data: " + cleaned + b"\n\n"
                elif _is_done(event):
                    settle()  # before the client reads the end: what it has seen is recorded by then
                yield event
        if pending:
            yield pending
    except UpstreamError as cut:
        error = f"upstream stream cut: {cut}"
        settle()  # before the client reads the error event, as before a [DONE]
        message = {"error": {"message": "the upstream's stream was cut short", "type": "upstream_error"}}
        yield f"data: {json.dumps(message)}\n\n".encode()
    except BaseException:  # the client went away (cancellation) or the server stops
        error = "client disconnected"
        raise
    finally:
        await response.aclose()
        settle()


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


def _usage_only(data: bytes) -> bool:
    event = _json_object(data)
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


def _number(value: Any, default: float, low: float, high: float) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high:
        return float(value)
    return default


def _new_id() -> str:
    return f"proxy-{uuid.uuid4().hex}"


def _upstream_error(status: int, message: str) -> JSONResponse:
    # The OpenAI error shape, which the clients of every stack parse.
    kind = "upstream_timeout" if status == 504 else "upstream_unavailable"
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


for _path in FORWARDED_PATHS:
    router.add_api_route(
        _path,
        forward,
        methods=["GET"] if _path == "/v1/models" else ["POST"],
        summary=f"pass-through {_path} (proxy mode)",
        description="Forwarded to proxy.upstream unchanged, body and response alike; recorded as one request.",
        tags=["proxy"],
    )
