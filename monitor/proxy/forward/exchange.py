"""One proxied request: what was asked, where it went, and the one record made of it (answered or failed).

An :class:`Exchange` is made when the request's body is in: it names the workload, picks the route
(:mod:`monitor.proxy.routing`), rewrites the body where the stack must be asked for its counts, and
keeps the one clock the record is timed by. Whichever path ends the request (a whole answer, the
relay's end, an upstream error, the client leaving) settles it once: one record through the
record's contract, or one count of an unrecorded request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import logging
import math
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from fastapi import Request

from decoder.causes import INLINE_TEXT_CHARS, MAX_TEXT_CHARS, copy_share, prompt_text, style_fingerprint
from decoder.record import LIMITS, WORKLOAD_PATTERN, RequestRecord
from monitor.api.errors import ApiError
from monitor.api.events import record_from
from monitor.api.state import ApiState
from monitor.ingest.stacks import PARSERS, Stack, StackError, reported
from monitor.ingest.stacks.report import StackReport
from monitor.ingest.stacks.sglang import is_sglang_openai
from monitor.proxy.asks import ask_sglang
from monitor.proxy.encoding import accepted_upstream, decoded
from monitor.proxy.forward.body import Body
from monitor.proxy.forward.events import answer_text
from monitor.proxy.routing import Router
from monitor.proxy.settings import ProxySettings
from monitor.store.rollouts import CURRENT_DRAFTER

log = logging.getLogger(__name__)

# The OpenAI-compatible endpoints, and the stacks' own (llama.cpp /completion, SGLang /generate).
OPENAI_PATHS: Final = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
NATIVE_PATHS: Final = ("/completion", "/generate")
USAGE_ON_REQUEST: Final = ("/v1/chat/completions", "/v1/completions")
# The generations, recorded when POSTed; anything else the engine serves is forwarded unrecorded.
RECORDED_PATHS: Final = (*OPENAI_PATHS, *NATIVE_PATHS)
# Hop-by-hop headers (RFC 9110 section 7.6.1) and those the HTTP layers recompute. Content-Encoding
# is end to end: a compressed body passes with it (monitor/proxy/encoding.py).
HOP_HEADERS: Final = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host",
     "content-length"}
)  # fmt: skip

PROXY_TOKEN_HEADER: Final = "x-draftwatch-token"
# Records whose style fingerprint and copy share wait for the worker (large texts); past this, a record goes
# without them (NULL, not computed) rather than queue text without bound behind a burst of large requests.
MAX_PENDING_CAUSES: Final = 64
_causes = ThreadPoolExecutor(max_workers=1, thread_name_prefix="draftwatch-causes")
_causes_room = threading.BoundedSemaphore(MAX_PENDING_CAUSES)


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


class Exchange:
    """One proxied request: what was asked, what came back, and the record made of it."""

    def __init__(
        self,
        state: ApiState,
        router: Router,
        request: Request,
        body: Body,
        model: object,
    ) -> None:
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
        self._is_settled = False
        # The record's fsync to the spool, under recorder.spool_before_reply: the answer ends only after it.
        self._on_disk: Future[bool] | None = None
        # The body goes upstream as it came; ``payload`` is what the entry read of it (a compressed one decoded,
        # a large one off the event loop, for its small members: monitor/proxy/forward/body.py), ``model`` what
        # routes it (monitor/proxy/forward/routes.py).
        self.payload = body.payload
        # The style and the prompt's text are read only off a body parsed whole: a large one's messages were
        # left unparsed (monitor/proxy/forward/sparse.py), and a fingerprint without them would be a wrong value.
        self._whole_body = body.sparse is None
        self._body_size = len(body.text if body.text is not None else body.raw)
        # The streamed answer's text, up to MAX_TEXT_CHARS characters: what its copy share is computed from.
        self._said: list[str] = []
        self._said_chars = 0
        self.workload = workload_of(request, self.payload, self.settings)
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
        self._original = body.raw
        added: dict[str, Any] = dict.fromkeys(self.sglang_added, True)
        # What goes upstream if the engine refuses the stream_options added below.
        self._without_usage = body.rewritten(added) if added else body.raw
        self.strip_usage = False
        # Chat and completions streams carry usage only when asked; a Responses stream always ends with it.
        member = self.route.member
        if self.streamed and self.path in USAGE_ON_REQUEST and self.payload is not None and member.takes_stream_options:
            options = self.payload.get("stream_options")
            options = options if isinstance(options, dict) else {}
            if options.get("include_usage") is not True:
                added["stream_options"] = self.payload["stream_options"] = {**options, "include_usage": True}
                self.strip_usage = True
        self.body = body.rewritten(added) if self.strip_usage else self._without_usage
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
        return self._is_settled

    @property
    def early_end(self) -> str:
        """Why the request ended before its answer did: the server stopping (past its drain), or the client leaving."""
        return "server shutting down" if self.state.stopping else "client disconnected"

    def unreadable(self, why: str) -> None:
        """A response forwarded whole but not readable here (a content coding not decoded): counted as unrecorded."""
        if self._settle():
            self.state.proxy_unrecorded += 1
            log.warning("proxied %s not recorded: %s", self.path, why)

    def _settle(self) -> bool:
        """End the request once, whichever path ends it (an abandoned one may end on two at once): its replica
        released. True the first time, for a request that is recorded."""
        if self._is_settled:
            return False
        self._is_settled = True
        self.release()
        return self.recording

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
        pool = self.route.deployment.pool(refused.pool)
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
        text = answer_text(event) if event is not None else ""
        if text:
            if self.first_text_s is None:
                self.first_text_s = now
            self.last_text_s = now
            self._gather(text)

    def _gather(self, text: str) -> None:
        """Keep a streamed piece of the answer, up to :data:`MAX_TEXT_CHARS` in all: a list append per event."""
        said = self._said
        if self.path == "/generate" and len(said) == 1 and text.startswith(said[0]):
            # SGLang's /generate streams the text so far in each event (unless started with incremental output).
            said[0] = text[:MAX_TEXT_CHARS]
            self._said_chars = len(said[0])
        elif self._said_chars < MAX_TEXT_CHARS:
            said.append(text[: MAX_TEXT_CHARS - self._said_chars])
            self._said_chars += len(said[-1])

    def record(self, report: Mapping[str, Any] | None, *, finish: str | None = None, error: str | None = None) -> None:
        """Hand the record of this request to the recorder, once; a report the parser refuses is counted, not stored."""
        if self._settle():
            self._make(report, finish, error, time.perf_counter())

    def record_after_reply(self, report: Mapping[str, Any], *, finish: str | None = None) -> None:
        """:meth:`record` an answer once the event loop is next free: after its last bytes went to the client.

        Reading the report, checking it and computing the causes cost a good part of the proxy's time per
        request; made after the reply, the client does not wait for them. The request is settled and its
        replica released now; the record keeps this moment as its end. Under ``recorder.spool_before_reply``
        the record must be on disk before the answer ends: it is made at once.
        """
        if self.state.settings.recorder.spool_before_reply:
            self.record(report, finish=finish)
        elif self._settle():
            self.state.recorder.expect()
            asyncio.get_running_loop().call_soon(self._make_later, report, finish, time.perf_counter())

    def _make_later(self, report: Mapping[str, Any], finish: str | None, end_s: float) -> None:
        """:meth:`_make` where nobody waits to catch what it raises: a fault is logged and counted, never lost."""
        try:
            self._make(report, finish, None, end_s)
        except Exception:
            self.state.proxy_unrecorded += 1
            log.exception("proxied %s not recorded: making its record failed", self.path)
        finally:
            self.state.recorder.arrived()

    def _make(self, report: Mapping[str, Any] | None, finish: str | None, error: str | None, end_s: float) -> None:
        """The record, ended at ``end_s`` (this request's clock), through the record's contract to the recorder."""
        ended = self.started + timedelta(seconds=end_s - self.t0)
        fields = {
            "workload": self.workload,
            "ts_start": self.started,
            "ts_end": ended,
            # SGLang's /generate names no model: the deployment's address stands in for it.
            "target_model": (self.payload or {}).get("model") or f"{self.settings.kind}@{self.upstream_host}",
            "drafter": self.route.drafter or CURRENT_DRAFTER,
            "temperature": _number((self.payload or {}).get("temperature"), "temperature", 0.0),
            "top_p": _number((self.payload or {}).get("top_p"), "top_p", 1.0),
        }
        try:
            if report is None or error is not None:
                rec = self._failure(fields, error or "the upstream's response carried no report")
            else:
                rec = self._success(fields, report, finish)
        except (StackError, ApiError, ValueError) as refused:
            self._refused(refused)
            return
        answer = "" if rec.finish_reason == "error" or report is None else self._answer(report)
        self._with_causes(rec, answer)

    def _answer(self, report: Mapping[str, Any]) -> str:
        """The answer's text: the stream's pieces as gathered, or a whole answer's own (bounded)."""
        if self.streamed:
            return "".join(self._said)
        return answer_text(report)[:MAX_TEXT_CHARS]

    def _with_causes(self, rec: RequestRecord, answer: str) -> None:
        """Add the style fingerprint and the copy share, then hand the record over; large texts in the worker.

        Small ones (most requests) cost well under a millisecond here. Larger ones would hold the event loop
        for milliseconds: the record goes to the worker, which hands it over when done (and :meth:`on_disk`
        waits for that where the spool must have it first).
        """
        if self._body_size + len(answer) <= INLINE_TEXT_CHARS:
            self._add_causes(rec, answer)
            self._on_disk = self._hand_over(rec)
            return
        if not _causes_room.acquire(blocking=False):
            self._on_disk = self._hand_over(rec)  # without the figures: NULL, as where they cannot be known
            return
        done: Future[bool] = Future()

        def work() -> None:
            try:
                self._add_causes(rec, answer)
            finally:
                _causes_room.release()
            try:
                kept = self._hand_over(rec)
            finally:
                self.state.recorder.arrived()
            if kept is None:
                done.set_result(True)
            else:
                kept.add_done_callback(lambda on_disk: done.set_result(on_disk.result()))

        self.state.recorder.expect()
        _causes.submit(work)
        if self.state.settings.recorder.spool_before_reply:
            self._on_disk = done

    def _add_causes(self, rec: RequestRecord, answer: str) -> None:
        """The record's style fingerprint and copy share, where the body was read whole; never raises."""
        if not self._whole_body:
            return
        try:
            rec.style_hash = style_fingerprint(self.payload)
            if answer:
                rec.prompt_copy_share = copy_share(prompt_text(self.payload), answer)
        except Exception as error:  # a body of an odd shape: the record goes without them, not lost
            log.warning("proxied %s: no style or copy share (%s)", self.path, type(error).__name__)

    def _hand_over(self, rec: RequestRecord) -> Future[bool] | None:
        """Give the record to the recorder: durable first where the spool must have it before the reply."""
        try:
            if self.state.settings.recorder.spool_before_reply:
                return self.state.recorder.record_durable(rec)
            self.state.recorder.record_nowait(rec)
        except ValueError as refused:
            self._refused(refused)
        return None

    def _refused(self, refused: Exception) -> None:
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
        # The candidate pool is speculative by declaration, as the speculative pool is beside a baseline.
        role = False if baseline else True if self.route.drafter else self.route.deployment.speculative_role
        parsed = PARSERS[stack](report, speculative=role)
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
        out; a failed one takes the pool's declared role) and go through the record's contract as every
        entrance does (:func:`monitor.api.events.record_from`).
        """
        latency_ms = (fields["ts_end"] - fields["ts_start"]) / timedelta(milliseconds=1)
        ttft_ms = None if self.ttft_s is None else self.ttft_s * 1000
        if parsed is not None and not self.streamed and parsed.ttft_ms is not None:
            # A non-streamed response arrives whole: the stack's own TTFT is the only one there is.
            ttft_ms = parsed.ttft_ms
        role = self.route.deployment.speculative_role
        mode = "holdout" if self.route.baseline else (parsed.mode if parsed else "speculative" if role else "plain")
        return record_from(
            {
                **fields,
                "request_id": (parsed and parsed.request_id) or _new_id(),
                **(reported(parsed) if parsed else {}),
                "mode": mode,
                # Nothing declared the pool's role: plain only because the answer carried no draft counts.
                "mode_inferred": mode == "plain" and role is None,
                "holdout_reason": self.route.holdout_reason,
                "ttft_ms": ttft_ms,
                "latency_ms": latency_ms,
                "decode_ms": self._decode_ms(parsed) if parsed else None,
                "upstream_inflight": self.inflight,
                # As the upstream's URL names it (host and port), credentials left out.
                "replica": self.route.member.upstream.netloc,
                # Its build, uptime and KV use as last read (monitor/proxy/engine_watch.py).
                **self.route.member.engine.fields(fields["ts_start"].timestamp()),
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
        if parsed.decode_ms is not None:
            return parsed.decode_ms
        if self.streamed and self.first_text_s is not None and self.last_text_s is not None:
            return (self.last_text_s - self.first_text_s) * 1000
        return None

    def _stack_named(self) -> str:
        """The configured stack; with proxy.kind auto, the one this replica's answers were last read as (else auto)."""
        return (self.settings.kind == "auto" and self.route.member.stack) or self.settings.kind


def _reason(refused: Exception) -> str:
    """Why a report was not recorded: the fields at fault and what is wrong with them, never their values."""
    if isinstance(refused, ApiError) and refused.detail:
        return "; ".join(f"{'.'.join(map(str, p.loc))}: {p.msg}" for p in refused.detail)[:500]
    return str(refused).splitlines()[0][:500]


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
