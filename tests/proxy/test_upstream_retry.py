"""A request reaches the upstream once: retried only when the upstream cannot have started it (issue 32).

The stand-in upstream is raw asyncio HTTP/1.1, so that a test decides exactly when a connection
closes: after reading a POST without answering it (the generation may be running: no retry), or
silently after an answer, idle, as llama-server does (the next request goes on a fresh
connection, without an error).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx

from monitor.api.app import create_app
from tests.api.conftest import make_settings
from tests.proxy.upstream import fixture
from tests.serving import serving

DROP = "drop"  # the user of a request the stand-in drops
WARM = 64  # proxy's KEEPALIVE: every idle connection it keeps


class StandIn:
    """Counts the POSTs it reads; drops the connection of a request whose user is ``DROP``.

    ``hold`` answers nothing until that many requests are waiting at once, so that a warm-up leaves
    that many connections idle in the proxy. ``close_after_answer`` closes each connection right
    after its answer, without ``Connection: close``.
    """

    def __init__(self, *, hold: int = 0, close_after_answer: bool = False) -> None:
        self.posts = 0
        self.dropped = 0
        self.connections = 0
        self.hold = hold
        self.close_after_answer = close_after_answer
        self._waiting = 0
        self._released: asyncio.Event | None = None
        self._answer = json.dumps(fixture("vllm", "chat-summary")["response"]).encode()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                if head.startswith(b"POST"):
                    self.posts += 1
                if body and json.loads(body).get("user") == DROP:
                    self.dropped += 1
                    return  # read it whole, answer nothing: the generation may well have started
                await self._held()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(self._answer), self._answer)
                )
                await writer.drain()
                if self.close_after_answer:
                    return
        finally:
            writer.close()

    async def _held(self) -> None:
        if not self.hold:
            return
        assert self._released is not None
        self._waiting += 1
        if self._waiting >= self.hold:
            self._released.set()
        await asyncio.wait_for(self._released.wait(), 30)

    @contextmanager
    def running(self) -> Iterator[str]:
        loop = asyncio.new_event_loop()
        started = threading.Event()
        server: list[asyncio.Server] = []

        async def start() -> None:
            self._released = asyncio.Event()
            server.append(await asyncio.start_server(self._serve, "127.0.0.1", 0))
            started.set()

        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        asyncio.run_coroutine_threadsafe(start(), loop).result(10)
        port = server[0].sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server[0].close()
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)


def chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


@contextmanager
def sidecar(tmp_path: Path, upstream_url: str) -> Iterator[str]:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'dw.db'}", DRAFTWATCH_PROXY_UPSTREAM=upstream_url)
    with serving(create_app(settings)) as base:
        yield base


def warm(base: str, count: int) -> None:
    """``count`` concurrent proxied requests, all answered: the proxy keeps ``count`` idle connections."""
    limits = httpx.Limits(max_connections=count)
    with httpx.Client(base_url=base, timeout=30, limits=limits) as client, ThreadPoolExecutor(count) as pool:
        statuses = list(pool.map(lambda _: client.post("/v1/chat/completions", json=chat()).status_code, range(count)))
    assert statuses == [200] * count


def test_a_post_the_upstream_dropped_unanswered_reaches_it_once_with_64_idle_connections(tmp_path: Path) -> None:
    stand_in = StandIn(hold=WARM)
    with stand_in.running() as url, sidecar(tmp_path, url) as base:
        warm(base, WARM)
        assert (stand_in.posts, stand_in.connections) == (WARM, WARM)
        with httpx.Client(base_url=base, timeout=30) as client:
            dropped = client.post("/v1/chat/completions", json=chat(user=DROP))
            assert stand_in.posts == WARM + 1 and stand_in.dropped == 1
            # A stream the same: the connection was cut before any event, so the client gets the error whole.
            streamed = client.post("/v1/chat/completions", json=chat(user=DROP, stream=True))
            assert stand_in.posts == WARM + 2 and stand_in.dropped == 2
            # The proxy still answers on the idle connections it kept.
            after = client.post("/v1/chat/completions", json=chat())
    for response in (dropped, streamed):
        assert response.status_code == 502
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("upstream_unavailable", 502)
        assert error["message"].startswith("the upstream at 127.0.0.1:")
    assert after.status_code == 200 and stand_in.posts == WARM + 3


def test_an_idle_connection_the_upstream_closed_silently_is_replaced_without_an_error(tmp_path: Path) -> None:
    stand_in = StandIn(close_after_answer=True)
    with stand_in.running() as url, sidecar(tmp_path, url) as base, httpx.Client(base_url=base, timeout=30) as client:

        def closed_by_now(answered: int) -> None:
            deadline = time.monotonic() + 10
            while stand_in.connections < answered and time.monotonic() < deadline:  # answered before it closed
                time.sleep(0.01)
            # The close reaches the proxy: its idle connection is readable now. Without the wait the next request
            # races the close, and one written whole before the close arrived is never sent twice: a 502.
            time.sleep(0.2)

        first = client.post("/v1/chat/completions", json=chat())
        closed_by_now(1)
        second = client.post("/v1/chat/completions", json=chat())
        closed_by_now(2)
        third = client.post("/v1/chat/completions", json=chat(stream=True))
    assert [r.status_code for r in (first, second, third)] == [200, 200, 200]
    assert second.json() == json.loads(stand_in._answer)
    # Each request went once, each on a connection of its own: none was sent on a closed one.
    assert (stand_in.posts, stand_in.connections) == (3, 3)


def test_requests_one_after_another_share_one_kept_alive_connection(tmp_path: Path) -> None:
    stand_in = StandIn()
    with stand_in.running() as url, sidecar(tmp_path, url) as base, httpx.Client(base_url=base, timeout=30) as client:
        answers = [client.post("/v1/chat/completions", json=chat()) for _ in range(5)]
        # A HEAD's answer has no body, whatever its length says (this one sends one anyway): its connection
        # is not reused.
        head = client.head("/v1/models")
        answers.append(client.post("/v1/chat/completions", json=chat()))
    assert [r.status_code for r in answers] == [200] * 6 and (head.status_code, head.content) == (200, b"")
    assert (stand_in.posts, stand_in.connections) == (6, 2)
