"""A serving stack's HTTP surface for the proxy tests, answering with the fixtures of tests/fixtures/stacks/.

vLLM and SGLang cannot run on this machine, so their responses are the fixtures built from their
current source (each fixture names the version it follows); the stream framing is the
OpenAI-compatible one both stacks write. llama.cpp is tested against the real llama-server in
tests/stacks/. The server is real HTTP (uvicorn on a free loopback port), and remembers what it
was sent so that a test can check what the proxy forwarded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from monitor.api.app import create_app
from tests.api.conftest import make_settings
from tests.serving import serving as serving_app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"


def fixture(stack: str, name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((FIXTURES / stack / f"{name}.json").read_text())
    return document


class Upstream:
    """What the stub was sent, and how it answers."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], dict[str, Any] | None]] = []
        self.chat = fixture("vllm", "chat-summary")["response"]
        self.generate = fixture("sglang", "generate-current")["response"]
        self.responses = fixture("vllm", "responses-incomplete")["response"]
        self.stream_pieces = ["Hel", "lo", " there"]
        self.stream_pause_s = 0.0
        self.fail_with: int | None = None
        self.models: list[dict[str, Any]] = [{"id": self.chat["model"], "object": "model"}]

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._chat, methods=["POST"]),  # the same report's shape
                Route("/generate", self._generate, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    async def _remember(self, request: Request) -> dict[str, Any] | None:
        raw = await request.body()
        body = json.loads(raw) if raw else None
        self.seen.append((request.url.path, dict(request.headers), body))
        return body

    async def _chat(self, request: Request) -> Response:
        body = await self._remember(request) or {}
        if self.fail_with is not None:
            error = {"error": {"message": "model overloaded", "type": "server_error", "code": self.fail_with}}
            return JSONResponse(error, self.fail_with)
        if not body.get("stream"):
            return JSONResponse(self.chat)
        usage = (body.get("stream_options") or {}).get("include_usage") is True
        return StreamingResponse(self._events(usage), media_type="text/event-stream")

    def stream_events(self, usage: bool) -> list[bytes]:
        """The events of a streamed chat, as vLLM frames them (OpenAI's chunk objects, then [DONE])."""
        base = {"id": "chatcmpl-s1", "object": "chat.completion.chunk", "created": 1, "model": self.chat["model"]}
        events = []
        for number, piece in enumerate(self.stream_pieces):
            last = number == len(self.stream_pieces) - 1
            choice = {"index": 0, "delta": {"content": piece}, "finish_reason": "length" if last else None}
            events.append({**base, "choices": [choice]})
        if usage:
            events.append({**base, "choices": [], "usage": self.chat["usage"], "metrics": self.chat["metrics"]})
        return [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]

    async def _events(self, usage: bool) -> AsyncIterator[bytes]:
        for event in self.stream_events(usage):
            yield event
            await asyncio.sleep(self.stream_pause_s)

    def response_events(self) -> list[bytes]:
        """A streamed Responses request as vLLM frames it: typed events, the last one holding the response."""
        done = {"type": "response.completed", "response": self.responses}
        delta = {"type": "response.output_text.delta", "delta": "Hello"}
        return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in (delta, done)]

    async def _responses(self, request: Request) -> Response:
        body = await self._remember(request) or {}
        if not body.get("stream"):
            return JSONResponse(self.responses)

        async def events() -> AsyncIterator[bytes]:
            for event in self.response_events():
                yield event
                await asyncio.sleep(self.stream_pause_s)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def _generate(self, request: Request) -> Response:
        await self._remember(request)
        return JSONResponse(self.generate)

    async def _models(self, request: Request) -> Response:
        await self._remember(request)
        return JSONResponse({"object": "list", "data": self.models})


@contextmanager
def serving(upstream: Upstream, port: int | None = None) -> Iterator[str]:
    """Serve ``upstream`` on a loopback port (a free one by default); yields its base URL."""
    with serving_app(upstream.app(), port) as url:
        yield url


def proxy_sidecar(tmp_path: Path, db_url: str, url: str, **env: str) -> TestClient:
    """The sidecar in proxy mode in front of ``url``, on ``db_url``, with ``env`` settings on top."""
    return TestClient(create_app(make_settings(tmp_path, db_url, DRAFTWATCH_PROXY_UPSTREAM=url, **env)))
