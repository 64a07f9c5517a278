"""An engine that behaves as a test asks (compresses, repeats headers, refuses stream_options, stalls), and
the sidecar in front of it on real HTTP, with the uvicorn options ``draftwatch serve`` uses.

The stub of tests/proxy/upstream.py answers as vLLM does; this one adds what a real deployment's
HTTP layer does around an engine (a gzip-compressing server, cookies, a slow body), and counts the
streams it was made to stop, which is how an engine learns that a request was abandoned.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import statistics
import threading
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from monitor.api.app import create_app
from monitor.api.server import uvicorn_options
from monitor.store.engine import create_engine
from monitor.store.models import RequestRow
from tests.api.conftest import make_settings
from tests.proxy.upstream import fixture
from tests.serving import serving

CHAT = fixture("vllm", "chat-summary")["response"]


class Engine:
    """What the engine was sent (raw headers and decoded bodies), and how it answers."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, list[tuple[bytes, bytes]], bytes]] = []
        self.compress = False
        self.ignore_accept_encoding = False  # compress even where the client asked for identity
        self.refuse_stream_options = False
        self.header_pause_s = 0.0  # before the response's headers
        self.event_pause_s = 0.0  # between a stream's events, and inside a slow body
        self.cut_streams = 0  # streams the engine was made to stop (the client went away)
        self.finished_streams = 0
        self._streams = 0
        # Each whole answer with an id of its own (the record's request_id), as streams have: for counting records.
        self.number_answers = False
        self._answers = 0

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._slow, methods=["POST"]),
                Route("/v1/cookies", self._cookies, methods=["GET"]),
                Route("/{path:path}", self._any, methods=["GET", "POST", "HEAD", "OPTIONS", "DELETE"]),
            ]
        )

    async def _remember(self, request: Request) -> dict[str, Any]:
        raw = await request.body()
        self.seen.append((request.method, request.url.path, list(request.headers.raw), raw))
        if request.headers.get("content-encoding") == "gzip":
            raw = gzip.decompress(raw)
        body = json.loads(raw) if raw else {}
        return body if isinstance(body, dict) else {}

    def _gzips(self, request: Request) -> bool:
        asked = "gzip" in request.headers.get("accept-encoding", "")
        return self.compress and (asked or self.ignore_accept_encoding)

    async def _chat(self, request: Request) -> Response:
        body = await self._remember(request)
        await asyncio.sleep(self.header_pause_s)
        if self.refuse_stream_options and "stream_options" in body:
            error = {"object": "error", "message": "stream_options: extra inputs are not permitted", "code": 400}
            return JSONResponse(error, 400)
        if not body.get("stream"):
            self._answers += 1
            content = json.dumps({**CHAT, "id": f"chatcmpl-w{self._answers}"} if self.number_answers else CHAT).encode()
            if self._gzips(request):
                return Response(gzip.compress(content), headers={"content-encoding": "gzip"},
                                media_type="application/json")  # fmt: skip
            return Response(content, media_type="application/json")
        usage = (body.get("stream_options") or {}).get("include_usage") is True
        self._streams += 1
        events = stream_events(usage=usage, timings=self.refuse_stream_options, number=self._streams)
        if self._gzips(request):
            return StreamingResponse(self._gzipped(events), media_type="text/event-stream",
                                     headers={"content-encoding": "gzip"})  # fmt: skip
        return StreamingResponse(self._paced(events), media_type="text/event-stream")

    async def _paced(self, events: list[bytes]) -> AsyncIterator[bytes]:
        finished = False
        try:
            for event in events:
                yield event
                await asyncio.sleep(self.event_pause_s)
            finished = True
        finally:
            if finished:
                self.finished_streams += 1
            else:
                self.cut_streams += 1

    async def _gzipped(self, events: list[bytes]) -> AsyncIterator[bytes]:
        # One gzip stream, flushed after each event as a compressing server does for server-sent events.
        compressor = zlib.compressobj(wbits=31)
        for event in events:
            yield compressor.compress(event) + compressor.flush(zlib.Z_SYNC_FLUSH)
        yield compressor.flush()

    async def _slow(self, request: Request) -> Response:
        """A whole JSON body that starts and then stalls."""
        await self._remember(request)
        return StreamingResponse(self._paced([b'{"id": "slow", ', b'"object": "chat.completion"}']),
                                 media_type="application/json")  # fmt: skip

    async def _cookies(self, request: Request) -> Response:
        await self._remember(request)
        response = Response(b"{}", media_type="application/json")
        response.raw_headers.extend((b"set-cookie", f"{name}={number}".encode()) for number, name in enumerate("abc"))
        return response

    async def _any(self, request: Request) -> Response:
        await self._remember(request)
        answer = {"path": request.url.path, "method": request.method}
        return JSONResponse(answer, headers={"x-engine": "yes"})


def stream_events(*, usage: bool, timings: bool = False, number: int = 1) -> list[bytes]:
    """Stream ``number``, in vLLM's framing; with ``timings``, its last chunk carries llama.cpp's figures instead."""
    base = {"id": f"chatcmpl-e{number}", "object": "chat.completion.chunk", "created": 1, "model": CHAT["model"]}
    events: list[dict[str, Any]] = []
    for number, piece in enumerate(["Hel", "lo", " there"]):
        last = number == 2
        choice = {"index": 0, "delta": {"content": piece}, "finish_reason": "length" if last else None}
        events.append({**base, "choices": [choice]})
    if timings:
        events[-1]["timings"] = {"prompt_n": 42, "prompt_ms": 10.0, "predicted_n": 54, "predicted_ms": 200.0,
                                 "draft_n": 60, "draft_n_accepted": 40}  # fmt: skip
        events[-1]["usage"] = {"prompt_tokens": 42, "completion_tokens": 54, "total_tokens": 96}
    if usage:
        events.append({**base, "choices": [], "usage": CHAT["usage"], "metrics": CHAT["metrics"]})
    return [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]


@contextmanager
def sidecar(tmp_path: Path, db_url: str, upstream_url: str, **env: str) -> Iterator[tuple[str, FastAPI]]:
    """The sidecar in proxy mode on real HTTP, with draftwatch serve's uvicorn options (its client limits, no
    Server, no Date)."""
    settings = make_settings(tmp_path, db_url, DRAFTWATCH_PROXY_UPSTREAM=upstream_url, **env)
    app = create_app(settings)
    with serving(app, **uvicorn_options(settings.api), log_level="warning") as url:
        yield url, app


def latencies(client: httpx.Client, until: threading.Event | None = None, count: int = 60) -> list[float]:
    """Small whole chats one after another (a client beside a fault): ``count``, or as many as run until ``until``."""
    ask = {"model": "qwen-coder", "messages": [{"role": "user", "content": "hi"}]}
    taken = []
    while (until is None and len(taken) < count) or (until is not None and not until.is_set()):
        started = time.perf_counter()
        assert client.post("/v1/chat/completions", json=ask).status_code == 200
        taken.append(time.perf_counter() - started)
    return taken


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


def rows(db_url: str) -> list[dict[str, Any]]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(select(RequestRow.__table__))]
    finally:
        engine.dispose()


def flushed(app: FastAPI) -> None:
    assert app.state.api.recorder.flush(30)
