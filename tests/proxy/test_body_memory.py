"""A request body is held once while its engine reads it, not once per way it passed through the sidecar.

The body's pieces were kept alive beside the joined body for the whole request, and a large body the
upstream socket could not take at once was copied into the transport's buffer: 480 MiB of bodies took
the sidecar to 1.6 GB. An engine that accepts the connections and reads nothing yet holds the bodies in
the sidecar; tracemalloc counts what the sidecar's Python holds meanwhile (the clients send with raw
sockets from one prepared buffer, and the engine allocates nothing until it reads).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.proxy.engine import CHAT, sidecar

BODY_BYTES = 20 << 20
BODIES = 2


@contextmanager
def engine_that_reads_late() -> Iterator[tuple[str, threading.Event]]:
    """An engine that takes connections and reads nothing until the event is set, then answers each a chat."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    release = threading.Event()
    stop = threading.Event()
    answer = json.dumps(CHAT).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(answer)

    def serve(conn: socket.socket) -> None:
        release.wait()
        conn.settimeout(10)
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            length = int(data.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            left = length - len(data.split(b"\r\n\r\n", 1)[1])
            while left > 0:
                left -= len(conn.recv(1 << 20))
            conn.sendall(head + answer)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", release
    finally:
        release.set()
        stop.set()
        acceptor.join(5)
        server.close()


def post_raw(url: str, request: bytes, statuses: list[bytes]) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(request)
        statuses.append(conn.recv(65536).split(b"\r\n", 1)[0])


def test_bodies_waiting_for_their_engine_are_held_once(tmp_path: Path) -> None:
    content = json.dumps({"model": "m", "messages": [{"role": "user", "content": "a" * BODY_BYTES}]}).encode()
    request = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    request += b"content-length: %d\r\n\r\n" % len(content) + content
    db_url = f"sqlite:///{tmp_path / 'proxy.db'}"
    statuses: list[bytes] = []
    with engine_that_reads_late() as (engine_url, release), sidecar(tmp_path, db_url, engine_url) as (url, app):
        tracemalloc.start()
        try:
            clients = [threading.Thread(target=post_raw, args=(url, request, statuses)) for _ in range(BODIES)]
            for client in clients:
                client.start()
            deadline = time.monotonic() + 30
            # Every body is in the sidecar and on its way upstream, where nothing is read yet.
            while app.state.api.router.deployments[0].speculative.members[0].inflight < BODIES:
                assert time.monotonic() < deadline, "the bodies did not reach the upstream"
                time.sleep(0.05)
            time.sleep(0.5)
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            release.set()
        for client in clients:
            client.join(60)
    assert statuses == [b"HTTP/1.1 200 OK"] * BODIES
    assert held < 1.5 * BODIES * len(content), f"{held / 2**20:.0f} MiB held for {BODIES} bodies of {BODY_BYTES >> 20}"
