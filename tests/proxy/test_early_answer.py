"""An engine that answers a large body before reading it (a 413 past its body limit) has answered (issue 49, item 2).

A server with a body limit answers 413 once it has read the head, and closes without reading the
rest (at once, or half-closing first and closing a moment later, as Go's net/http does): the
proxy's write of the body fails with the answer already in. That answer is the client's, the
request is never sent again, and the replica that refused it stays in its pool. A server that
answers early and keeps the connection, reading the body later or never, is answered at once too.

The stand-in is plain blocking sockets, a thread a connection, so that a test decides exactly what
is read and when the socket closes; its receive buffer is small, so that the body cannot sit whole
in the kernel's buffers before the server has read it.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.proxy.engine import sidecar
from tests.proxy.test_health import metric
from tests.proxy.upstream import fixture

LIMIT = 1024 * 1024  # the stand-in's body limit
LARGE = 5 * 1024 * 1024
REFUSAL = json.dumps({"error": {"message": "request body too large", "type": "invalid_request_error"}}).encode()
ANSWER = json.dumps(fixture("vllm", "chat-summary")["response"]).encode()
# The server closes at once; half-closes, then closes a moment later (Go's net/http waits 500 ms); or keeps the
# connection, reading the body only once the test lets it (or after HELD_S).
AT_ONCE, HALF_CLOSE, KEEPS_READING = "at-once", "half-close", "keeps-reading"
HELD_S = 10.0


class BodyLimit:
    """Reads each request's head; past ``LIMIT`` answers 413 at once (with ``Connection: close``), else 200."""

    def __init__(self, after_refusal: str) -> None:
        self.after_refusal = after_refusal
        self.heads: list[int] = []  # each request's Content-Length, as its head was read
        self.read_on = threading.Event()  # KEEPS_READING: the test let the server read the body
        self.held_out = False  # KEEPS_READING: the server gave up waiting and read the body anyway
        self._listener = socket.socket()
        # Set before listen, so that accepted connections take it: the unread body fills the window at once.
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.netloc = self.url.removeprefix("http://")

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed: the test is over
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                piece = conn.recv(65536)
                if not piece:
                    return
                data += piece
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))  # fmt: skip
            self.heads.append(length)
            if length > LIMIT:
                self._refuse(conn, length - len(body))
                return
            unread = length - len(body)
            while unread > 0 and (piece := conn.recv(65536)):
                unread -= len(piece)
            if unread == 0:  # answered once the body is read whole
                conn.sendall(self._response(200, ANSWER))

    def _refuse(self, conn: socket.socket, unread: int) -> None:
        conn.sendall(self._response(413, REFUSAL))
        if self.after_refusal == HALF_CLOSE:
            conn.shutdown(socket.SHUT_WR)
            time.sleep(0.1)
        elif self.after_refusal == KEEPS_READING:
            self.held_out = not self.read_on.wait(HELD_S)
            try:
                while unread > 0 and (piece := conn.recv(65536)):
                    unread -= len(piece)
            except OSError:
                pass  # the proxy dropped the connection: it had its answer
        # Closed with the body unread (AT_ONCE, HALF_CLOSE): the kernel resets the connection.

    @staticmethod
    def _response(status: int, body: bytes) -> bytes:
        reason = b"OK" if status == 200 else b"Request Entity Too Large"
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        return head % (status, reason, len(body)) + body

    @contextmanager
    def running(self) -> Iterator[str]:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        try:
            yield self.url
        finally:
            self.read_on.set()
            self._listener.close()


def chat(content: str) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'proxy.db'}"


@pytest.mark.parametrize("after_refusal", [AT_ONCE, HALF_CLOSE])
def test_an_engine_that_refuses_a_large_body_and_closes_has_answered_the_client_once_and_stays_in_its_pool(
    tmp_path: Path, db_url: str, after_refusal: str
) -> None:
    a, b = BodyLimit(after_refusal), BodyLimit(after_refusal)
    # One failure would take a replica out: the refusals must count as none.
    env = {"DRAFTWATCH_PROXY_EJECT_AFTER": "1", "DRAFTWATCH_PROXY_EJECT_COOLDOWN_S": "60"}
    with (
        a.running() as a_url,
        b.running() as b_url,
        sidecar(tmp_path, db_url, f"{a_url},{b_url}", **env) as (url, _),
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        refused = [client.post("/v1/chat/completions", json=chat("x" * LARGE)) for _ in range(4)]
        assert [(r.status_code, r.content) for r in refused] == [(413, REFUSAL)] * 4
        # Each went once, to a replica of its own turn: none was written again on a new connection.
        assert len(a.heads) + len(b.heads) == 4 and min(a.heads + b.heads) > LARGE
        assert len(a.heads) == len(b.heads) == 2
        assert [metric(url, stand_in.netloc) for stand_in in (a, b)] == ["1", "1"]
        # A large body under the limit: written whole while its answer is watched for, then answered.
        ordinary = client.post("/v1/chat/completions", json=chat("x" * (LIMIT // 2)))
        assert (ordinary.status_code, ordinary.json()) == (200, json.loads(ANSWER))


def test_an_engine_that_refuses_a_large_body_but_reads_it_later_is_answered_without_waiting_for_the_write(
    tmp_path: Path, db_url: str
) -> None:
    engine = BodyLimit(KEEPS_READING)
    with (
        engine.running() as engine_url,
        sidecar(tmp_path, db_url, engine_url) as (url, _),
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        refused = client.post("/v1/chat/completions", json=chat("x" * LARGE))
        # Answered while the engine still held the body unread: the write, which cannot end before, was not waited for.
        engine.read_on.set()
        assert (refused.status_code, refused.content, engine.held_out) == (413, REFUSAL, False)
        ordinary = client.post("/v1/chat/completions", json=chat("hi"))
        assert ordinary.status_code == 200
    assert engine.heads[0] > LARGE and len(engine.heads) == 2
