"""Clients that are slow or send too much are cut, as a gateway cuts them, while others are served (issue 49).

A head trickled a byte at a time (or nothing at all) once held a connection as long as the client
liked, a stalled body too, and 50,000 header fields or a 4 MiB header value were forwarded to the
engine: now 408 at the head's or the body's timeout, 431 past the head's limits (monitor/api/
connections.py, monitor/api/limits.py), and a bound on the request bodies held at once answers 503
with Retry-After. Raw sockets on loopback against the sidecar on uvicorn with serve's options, in
front of a stand-in engine.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy.engine import Engine, sidecar
from tests.serving import serving

TIMEOUT_S = 1.0  # the head's and the body's, small here (10 s and 30 s by default)
MARGIN_S = 2.0
EARLY_S = 0.1  # the server's clock starts the timeout a little before the client's
LIMITS = {"DRAFTWATCH_API_HEADER_TIMEOUT_S": str(TIMEOUT_S), "DRAFTWATCH_API_BODY_TIMEOUT_S": str(TIMEOUT_S)}
CHAT = "/v1/chat/completions"


@pytest.fixture
def engine() -> Engine:
    return Engine()


@pytest.fixture
def url(tmp_path: Path, engine: Engine, request: pytest.FixtureRequest) -> Iterator[str]:
    env = {**LIMITS, **getattr(request, "param", {})}
    db_url = f"sqlite:///{tmp_path / 'proxy.db'}"
    with serving(engine.app(), log_level="warning") as upstream, sidecar(tmp_path, db_url, upstream, **env) as (at, _):
        yield at


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=TIMEOUT_S + MARGIN_S)


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The one answer on ``sock``, read until the server closes it; (0, {}, b"") for a close without one."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    if not data:
        return 0, {}, b""
    head, _, body = data.partition(b"\r\n\r\n")
    status, *fields = head.decode().split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (f.partition(":") for f in fields)}
    return int(status.split()[1]), headers, body


def sent_whole(sock: socket.socket, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` and read the answer; the server may answer and close before it has read all of it."""
    with contextlib.suppress(ConnectionResetError):  # what it answered is still read below
        sock.sendall(data)
    return answer(sock)


def ordinary(url: str) -> int:
    return httpx.get(f"{url}/v1/models", timeout=10).status_code


def test_a_head_trickled_byte_by_byte_is_cut_with_408_at_its_timeout_while_others_are_served(
    url: str, engine: Engine
) -> None:
    head = b"GET /v1/models HTTP/1.1\r\nHost: engine\r\nX-Workload: " + b"w" * 200 + b"\r\n\r\n"
    trickled, silent = connect(url), connect(url)
    opened = time.monotonic()

    def trickle() -> None:
        for byte in head:
            try:
                trickled.send(bytes([byte]))
            except OSError:
                return  # cut
            time.sleep(0.05)

    sender = threading.Thread(target=trickle)
    sender.start()
    served = [ordinary(url) for _ in range(5)]
    status, headers, body = answer(trickled)
    cut_s = time.monotonic() - opened
    # A connection that never sends a byte is closed without an answer, at the same timeout.
    nothing = answer(silent)
    silent_s = time.monotonic() - opened
    sender.join()
    trickled.close()
    silent.close()
    assert served == [200] * 5
    assert status == 408 and headers["connection"] == "close"
    assert json.loads(body)["error"]["message"] == (
        f"the request's head did not arrive within {TIMEOUT_S:g} s (api.header_timeout_s)"
    )
    assert TIMEOUT_S - EARLY_S <= cut_s < TIMEOUT_S + MARGIN_S
    assert nothing == (0, {}, b"") and silent_s < TIMEOUT_S + MARGIN_S
    assert [path for _, path, _, _ in engine.seen] == ["/v1/models"] * 5


def test_a_connection_idle_between_requests_is_kept_alive_past_the_head_timeout(url: str, engine: Engine) -> None:
    # The wait for a next request is uvicorn's timeout_keep_alive (5 s), not the head's.
    kept = connect(url)
    request = b"GET /v1/models HTTP/1.1\r\nHost: engine\r\n\r\n"
    statuses = []
    with kept.makefile("rb") as answers:
        for pause in (0.0, TIMEOUT_S + 0.5):
            time.sleep(pause)
            kept.sendall(request)
            statuses.append(int(answers.readline().split()[1]))
            fields = list(iter(answers.readline, b"\r\n"))  # up to the head's blank line
            answers.read(next(int(f.split(b":")[1]) for f in fields if f.lower().startswith(b"content-length:")))
    kept.close()
    assert statuses == [200, 200] and len(engine.seen) == 2


@pytest.mark.parametrize(
    ("path", "error"),
    [
        # A proxied route answers in the OpenAI shape its client parses; draftwatch's own in its own.
        (CHAT, {"error": {"message": f"the body's next byte did not arrive within {TIMEOUT_S:g} s "
                          "(api.body_timeout_s)", "type": "invalid_request_error", "code": "body_timeout"}}),
        ("/v1/events", {"error": "body_timeout", "message": f"the body's next byte did not arrive within "
                        f"{TIMEOUT_S:g} s (api.body_timeout_s)"}),
    ],
)  # fmt: skip
def test_a_body_that_stalls_is_cut_with_408_at_its_timeout(
    url: str, engine: Engine, path: str, error: dict[str, Any]
) -> None:
    stalled = connect(url)
    head = f"POST {path} HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    stalled.sendall(head.encode() + b'{"model": "qwen-coder", ')
    sent = time.monotonic()
    assert ordinary(url) == 200
    status, headers, body = answer(stalled)
    cut_s = time.monotonic() - sent
    stalled.close()
    assert status == 408 and headers["connection"] == "close" and json.loads(body) == error
    assert TIMEOUT_S - EARLY_S <= cut_s < TIMEOUT_S + MARGIN_S
    assert [path for _, path, _, _ in engine.seen] == ["/v1/models"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([f"X-Field-{n}: v" for n in range(50_000)], "the request's head exceeds 65536 bytes (api.max_header_bytes)"),
        (["X-Large: " + "v" * (4 << 20)], "the request's head exceeds 65536 bytes (api.max_header_bytes)"),
        # Under the bytes' limit, over the count's.
        ([f"X-F{n}: v" for n in range(101)], "the request has more than 100 header fields (api.max_headers)"),
        # Both in one read, the head whole: the bytes' limit still holds.
        (["X-Large: " + "v" * (64 << 10)], "the request's head exceeds 65536 bytes (api.max_header_bytes)"),
    ],
    ids=["50k-fields", "4MiB-value", "101-fields", "64KiB-value"],
)
def test_a_head_with_too_many_or_too_large_fields_gets_431_and_never_reaches_the_engine(
    url: str, engine: Engine, fields: list[str], message: str
) -> None:
    head = f"POST {CHAT} HTTP/1.1\r\nHost: engine\r\n" + "".join(f"{f}\r\n" for f in fields)
    body = json.dumps({"model": "qwen-coder", "messages": [{"role": "user", "content": "hi"}]})
    refused = connect(url)
    status, headers, answered = sent_whole(refused, f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode())
    refused.close()
    # Within the limits (with httpx's own, 96 fields and about 62 KB): served as ever.
    within = {f"X-F{n}": "v" * 680 for n in range(90)}
    passed = httpx.post(f"{url}{CHAT}", content=body, headers=within, timeout=10)
    assert status == 431 and headers["connection"] == "close"
    assert json.loads(answered) == {"error": {"message": message, "type": "invalid_request_error", "code": 431}}
    assert passed.status_code == 200
    assert len(engine.seen) == 1 and sum(name.startswith(b"x-f") for name, _ in engine.seen[0][2]) == 90


@pytest.mark.parametrize("url", [{"DRAFTWATCH_API_MAX_BODY_BYTES_IN_FLIGHT": str(3 << 20)}], indirect=True)
def test_request_bodies_held_at_once_are_bounded_with_503_and_retry_after(url: str, engine: Engine) -> None:
    engine.header_pause_s = 1.0  # each answer waits: the bodies stay held meanwhile
    prompt = {"model": "qwen-coder", "messages": [{"role": "user", "content": "x" * (1200 << 10)}]}
    body = json.dumps(prompt).encode()
    answers: list[int] = []

    def post() -> None:
        answers.append(httpx.post(f"{url}{CHAT}", content=body, timeout=30).status_code)

    held = [threading.Thread(target=post) for _ in range(2)]
    for thread in held:
        thread.start()
    deadline = time.monotonic() + 10
    while len(engine.seen) < 2:  # both bodies read, about 2.4 of 3 MiB held
        assert time.monotonic() < deadline, "the engine was never sent both requests"
        time.sleep(0.02)
    declared = httpx.post(f"{url}{CHAT}", content=body, timeout=30)
    # A chunked body is counted as it comes: refused once it would pass the bound.
    chunked = httpx.post(f"{url}{CHAT}", content=iter([body[: 1 << 20], body[1 << 20 :]]), timeout=30)
    for thread in held:
        thread.join()
    # Nothing is left counted: two more are held at once again.
    again = [threading.Thread(target=post) for _ in range(2)]
    for thread in again:
        thread.start()
    for thread in again:
        thread.join()
    assert answers == [200] * 4
    for refused in (declared, chunked):
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "bodies_in_flight"
        assert refused.json()["error"]["type"] == "server_error"
    assert len(engine.seen) == 4
