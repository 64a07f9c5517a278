"""What a client sends can be hostile or odd: it is the client's to answer for, never a replica's (issue 37).

A request no engine could be sent (CONNECT, a target that is not a path) is answered 400 by the proxy
and counts against no replica; the target goes upstream as the client wrote it; a non-canonical path
to a generation is recorded; a non-string model is refused; a compressed body is decoded off the event
loop and refused once it decodes past proxy.max_body_bytes. Stand-in upstreams on real ports.
"""

from __future__ import annotations

import functools
import http.client
import json
import threading
import time
import tracemalloc
import uuid
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from tests.proxy.engine import CHAT, flushed, rows, sidecar
from tests.proxy.test_health import metric
from tests.serving import serving

ASK = {"model": "qwen-coder", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'proxy.db'}"


class Targets:
    """An engine that remembers each request's target as it came on the wire, and answers a chat (an id each)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes, bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        self.seen.append((scope["method"], scope["raw_path"], scope["query_string"]))
        body = json.dumps({**CHAT, "id": f"chatcmpl-{uuid.uuid4().hex}"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def raw_request(url: str, method: str, target: str) -> tuple[int, dict[str, Any]]:
    """``method target`` on the wire as written (http.client, which neither checks nor rewrites either)."""
    connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)
    try:
        connection.request(method, target)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@functools.cache
def gzipped(size: int, byte: bytes) -> bytes:
    """``size`` bytes of ``byte``, gzipped in pieces (never held whole)."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
    piece = byte * (1 << 20)
    return b"".join([*(compressor.compress(piece) for _ in range(size >> 20)), compressor.flush()])


def test_a_request_no_engine_could_be_sent_is_a_400_of_the_proxys_and_never_ejects_a_replica(
    tmp_path: Path, db_url: str
) -> None:
    a, b = Targets(), Targets()
    env = {"DRAFTWATCH_PROXY_EJECT_AFTER": "2", "DRAFTWATCH_PROXY_EJECT_COOLDOWN_S": "600"}
    with (
        serving(a, log_level="warning") as a_url,
        serving(b, log_level="warning") as b_url,
        sidecar(tmp_path, db_url, f"{a_url},{b_url}", **env) as (url, app),
    ):
        refused = [raw_request(url, method, target) for method, target in [("CONNECT", "/v1/models"),
                                                                          ("OPTIONS", "*")] * 3]  # fmt: skip
        # Well-formed on the wire, whatever they decode to: the engine's to answer.
        odd = [httpx.get(f"{url}/v1/models{escape}", timeout=30) for escape in ("%20x", "%00", "%0d%0a") * 3]
        answers = [httpx.post(f"{url}/v1/chat/completions", json=ASK, timeout=30) for _ in range(4)]
        up = [metric(url, netloc.removeprefix("http://")) for netloc in (a_url, b_url)]
        flushed(app)
    assert {status for status, _ in refused} == {400}
    assert refused[0][1] == {"error": {"message": "CONNECT is not served: this is an engine's API, not a tunnel",
                                       "type": "invalid_request_error", "code": "invalid_request_target"}}  # fmt: skip
    assert refused[1][1]["error"]["message"] == (
        "the request target must be a path of visible ASCII characters (RFC 9112)"
    )
    assert [r.status_code for r in (*odd, *answers)] == [200] * 13
    forwarded = sorted(target for _, target, _ in (*a.seen, *b.seen) if target.startswith(b"/v1/models"))
    assert forwarded == sorted([b"/v1/models%20x", b"/v1/models%00", b"/v1/models%0d%0a"] * 3)
    # Both replicas still in the pool, sharing the generations; no request of the client's counted against them.
    assert up == ["1", "1"]
    assert [len([s for s in stub.seen if s[0] == "POST"]) for stub in (a, b)] == [2, 2]
    assert len(rows(db_url)) == 4


def test_the_target_goes_upstream_as_the_client_wrote_it_and_an_escaped_query_is_no_query(
    tmp_path: Path, db_url: str
) -> None:
    engine = Targets()
    with serving(engine, log_level="warning") as engine_url, sidecar(tmp_path, db_url, engine_url) as (url, app):
        answer = httpx.post(f"{url}/v1/chat/completions%3Fx=1?y=%20z&w=%3F", json=ASK, timeout=30)
        flushed(app)
    assert answer.status_code == 200
    assert engine.seen == [("POST", b"/v1/chat/completions%3Fx=1", b"y=%20z&w=%3F")]
    # Not the generation route (its path ends in "?x=1"): forwarded unrecorded, as the engine reads it.
    assert rows(db_url) == []


def test_a_non_canonical_path_to_a_generation_goes_as_sent_and_is_recorded(tmp_path: Path, db_url: str) -> None:
    # A stand-in that serves any path, as a gateway that merges slashes (nginx does by default) in front of vLLM.
    engine = Targets()
    paths = ["//v1/chat/completions", "/v1/chat/completions/", "/V1/Chat/Completions", "/v1//completions"]
    with serving(engine, log_level="warning") as engine_url, sidecar(tmp_path, db_url, engine_url) as (url, app):
        answers = [httpx.post(f"{url}{path}", json=ASK, timeout=30) for path in paths]
        flushed(app)
    assert [a.status_code for a in answers] == [200] * 4
    assert [target for _, target, _ in engine.seen] == [path.encode() for path in paths]
    assert [row["target_model"] for row in rows(db_url)] == ["qwen-coder"] * 4


@pytest.mark.parametrize("model", [42, ["qwen-coder"], {"name": "qwen-coder"}, True])
def test_a_generation_whose_model_is_not_a_string_is_a_400_and_reaches_no_replica(
    tmp_path: Path, db_url: str, model: object
) -> None:
    engine = Targets()
    with serving(engine, log_level="warning") as engine_url, sidecar(tmp_path, db_url, engine_url) as (url, app):
        refused = httpx.post(f"{url}/v1/chat/completions", json={**ASK, "model": model}, timeout=30)
        unnamed = httpx.post(f"{url}/v1/chat/completions", json={**ASK, "model": None}, timeout=30)
        flushed(app)
    assert refused.status_code == 400
    assert refused.json() == {"error": {"message": "model must be a string", "type": "invalid_request_error",
                                        "code": "invalid_model"}}  # fmt: skip
    # No model at all is the engine's to decide (vLLM serves its one model): forwarded and recorded.
    assert unnamed.status_code == 200 and len(engine.seen) == 1 and len(rows(db_url)) == 1


def test_a_body_nested_deeper_than_the_parser_goes_is_a_400_not_a_500(tmp_path: Path, db_url: str) -> None:
    engine = Targets()
    body = b'{"model": "qwen-coder", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with serving(engine, log_level="warning") as engine_url, sidecar(tmp_path, db_url, engine_url) as (url, app):
        answer = httpx.post(f"{url}/v1/chat/completions", content=body, timeout=30)
        flushed(app)
    # Unreadable, it can be routed by no model: the client's mistake, never sent to another model's engine.
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_body"
    assert engine.seen == [] and rows(db_url) == []


def test_a_gzip_bomb_is_a_413_without_being_inflated_past_the_limit(tmp_path: Path, db_url: str) -> None:
    engine = Targets()
    bomb = gzipped(1 << 30, b"\0")  # about 4.5 MB that inflate to 1 GiB
    headers = {"content-encoding": "gzip", "content-type": "application/json"}
    env = {"DRAFTWATCH_PROXY_MAX_BODY_BYTES": str(8 << 20)}
    with serving(engine, log_level="warning") as engine_url, sidecar(tmp_path, db_url, engine_url, **env) as (url, _):
        tracemalloc.start()
        try:
            answer = httpx.post(f"{url}/v1/chat/completions", content=bomb, headers=headers, timeout=30)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert answer.status_code == 413
    assert answer.json() == {"error": {"message": f"the decoded body exceeds {8 << 20} bytes",
                                       "type": "invalid_request_error", "code": "body_too_large"}}  # fmt: skip
    assert engine.seen == [] and peak < 64 << 20


def test_a_large_compressed_body_is_decoded_off_the_event_loop_while_other_requests_are_served(
    tmp_path: Path, db_url: str
) -> None:
    engine = Targets()
    large = gzipped(256 << 20, b"\xff")  # about 1 MB on the wire, 256 MiB decoded (not JSON: nothing to parse)
    env = {"DRAFTWATCH_PROXY_MAX_BODY_BYTES": str(512 << 20)}
    handled: list[float] = []
    latencies: list[float] = []
    with (
        serving(engine, log_level="warning") as engine_url,
        sidecar(tmp_path, db_url, engine_url, **env) as (url, _),
        httpx.Client(base_url=url, timeout=60) as client,
        httpx.Client(base_url=url, timeout=60) as small,
    ):
        for warm in (client, small):
            assert warm.get("/v1/models").status_code == 200

        def send_large() -> None:
            started = time.perf_counter()
            response = client.post("/v1/audio/transcriptions", content=large, headers={"content-encoding": "gzip"})
            assert response.status_code == 200
            handled.append(time.perf_counter() - started)

        sender = threading.Thread(target=send_large)
        sender.start()
        while sender.is_alive():
            started = time.perf_counter()
            assert small.get("/v1/models").status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(0.005)
        sender.join()
    # Several small requests were answered while the large body was in hand, none of them held for its decoding.
    (large_s,) = handled
    assert len(latencies) >= 5 and max(latencies) < large_s / 3, (max(latencies), large_s)
