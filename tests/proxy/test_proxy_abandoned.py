"""A client that abandons a request: the engine's request is cancelled, one error record is written, and the
replica's in-flight count comes back to 0 (issue 32)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.proxy.engine import Engine, flushed, rows, serving, sidecar
from tests.proxy.upstream import Upstream, proxy_sidecar
from tests.serving import wait_for

STREAMS = 100


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'proxy.db'}"


@pytest.fixture
def engine() -> Engine:
    return Engine()


@pytest.fixture
def engine_url(engine: Engine) -> Iterator[str]:
    with serving(engine.app()) as url:
        yield url


def inflight(app: FastAPI) -> list[int]:
    return [m.inflight for m in app.state.api.router.members()]


def test_a_hundred_abandoned_streams_give_a_hundred_error_records_and_release_the_replica(
    tmp_path: Path, db_url: str, engine: Engine, engine_url: str
) -> None:
    engine.event_pause_s = 30.0  # the engine would go on generating for nobody
    body = {"model": "m", "messages": [], "stream": True}

    async def abandon(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            async def one() -> None:
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    async for _ in response.aiter_raw():
                        return  # the first event, then gone

            await asyncio.gather(*(one() for _ in range(STREAMS)))

    with sidecar(tmp_path, db_url, engine_url) as (url, app):
        asyncio.run(abandon(url))
        wait_for(lambda: engine.cut_streams == STREAMS, lambda: f"the engine stopped {engine.cut_streams} streams", 60)
        wait_for(lambda: inflight(app) == [0], lambda: f"in flight: {inflight(app)}", 60)
        flushed(app)
    stored = rows(db_url)
    assert len(stored) == STREAMS
    assert {(r["finish_reason"], r["error"]) for r in stored} == {("error", "client disconnected")}
    assert engine.finished_streams == 0


def test_a_client_leaving_before_the_answer_starts_or_while_it_is_read_cancels_it_with_one_error_record(
    tmp_path: Path, db_url: str, engine: Engine, engine_url: str
) -> None:
    async def leave(url: str, path: str, body: dict[str, Any], seen: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            task = asyncio.ensure_future(client.post(path, json=body))
            while len(engine.seen) < seen:  # the engine has the request: now the client goes
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    with sidecar(tmp_path, db_url, engine_url) as (url, app):
        engine.header_pause_s = 3.0  # no answer yet: a stream's headers never came
        asyncio.run(leave(url, "/v1/chat/completions", {"model": "m", "messages": [], "stream": True}, 1))
        wait_for(lambda: inflight(app) == [0], lambda: f"in flight: {inflight(app)}", 60)
        engine.header_pause_s, engine.event_pause_s = 0.0, 30.0  # a whole body that started, then stalls
        asyncio.run(leave(url, "/v1/completions", {"model": "m", "prompt": "hi"}, 2))
        wait_for(lambda: engine.cut_streams == 1, "the engine's body was never stopped", 60)
        wait_for(lambda: inflight(app) == [0], lambda: f"in flight: {inflight(app)}", 60)
        flushed(app)
    stored = rows(db_url)
    assert [(r["finish_reason"], r["error"]) for r in stored] == [("error", "client disconnected")] * 2


def test_a_stream_the_client_left_before_its_first_event_is_recorded_and_released(
    tmp_path: Path, db_url: str, upstream: tuple[Upstream, str]
) -> None:
    # The stream's response is returned, then the client is gone before it starts: its generator never
    # runs, so nothing inside it can record or release. Driven over ASGI to hit exactly that moment.
    _, url = upstream
    body = json.dumps({"model": "m", "messages": [], "stream": True}).encode()
    with proxy_sidecar(tmp_path, db_url, url) as client:
        app: FastAPI = client.app  # type: ignore[assignment]

        async def request() -> None:
            started = asyncio.Event()
            messages = iter([{"type": "http.request", "body": body, "more_body": False}])

            async def receive() -> dict[str, Any]:
                if (message := next(messages, None)) is not None:
                    return message
                await started.wait()  # the client leaves once the answer's headers are on their way
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    started.set()
                    await asyncio.sleep(30)  # a slow socket: the disconnect comes first

            scope = {
                "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
                "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }  # fmt: skip
            await asyncio.wait_for(app(scope, receive, send), 20)

        assert isinstance(client, TestClient) and client.portal is not None
        client.portal.call(request)
        assert inflight(app) == [0]
        flushed(app)
    (row,) = rows(db_url)
    assert (row["finish_reason"], row["error"]) == ("error", "client disconnected")
