"""A large server-sent event is relayed in linear time without holding the others, and one past the bound passes unread.

Engines do send such events: the logprobs of a long prompt, SGLang's ``meta_info`` with input
logprobs. The relay copied and searched its whole pending buffer at each 64 KiB read (a 20 MiB event
took about 10 s of the event loop's time, every other client waiting), and parsed the event on the
loop. Stand-in engines on real ports; times compared with what the same run measures without the fault.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from tests.proxy.engine import CHAT, Engine, flushed, latencies, p99, rows, sidecar
from tests.serving import serving

ASK = {"model": "qwen-coder", "messages": [{"role": "user", "content": "hi"}]}
# One token's logprobs as vLLM streams them (logprobs: true, top_logprobs: 2).
ENTRY = {"token": "hello", "logprob": -0.123456, "bytes": [104, 101, 108, 108, 111],
         "top_logprobs": [{"token": "hi", "logprob": -1.5, "bytes": [104, 105]}] * 2}  # fmt: skip
BASE = {"id": "chatcmpl-big", "object": "chat.completion.chunk", "created": 1, "model": CHAT["model"]}


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'proxy.db'}"


def chunk(content: str, size: int = 0, finish: str | None = None, name: str = "big") -> bytes:
    """One chat chunk of stream ``name`` carrying ``content``, with about ``size`` bytes of logprobs."""
    entries = [ENTRY] * (size // len(json.dumps(ENTRY)))
    choice = {"index": 0, "delta": {"content": content}, "logprobs": {"content": entries}, "finish_reason": finish}
    return b"data: " + json.dumps({**BASE, "id": f"chatcmpl-{name}", "choices": [choice]}).encode() + b"\n\n"


def stream(*events: bytes, name: str = "big") -> list[bytes]:
    usage = {**BASE, "id": f"chatcmpl-{name}", "choices": [], "usage": CHAT["usage"], "metrics": CHAT["metrics"]}
    return [*events, b"data: " + json.dumps(usage).encode() + b"\n\n", b"data: [DONE]\n\n"]


class Streamer:
    """An engine whose streamed chats send ``events`` (in pieces of 64 KiB, as a socket would); a whole chat at once."""

    def __init__(self, events: list[bytes]) -> None:
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        pieces = []
        while True:
            message = await receive()
            pieces.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(pieces)
        if not json.loads(body).get("stream"):
            content = json.dumps(CHAT).encode()
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())]})  # fmt: skip
            await send({"type": "http.response.body", "body": content})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for event in self.events:
            for start in range(0, len(event), 1 << 16):
                await send({"type": "http.response.body", "body": event[start : start + (1 << 16)], "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def relayed(url: str, events: list[bytes]) -> tuple[bytes, float]:
    """The bytes a streaming client gets, and how long they took."""
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**ASK, "stream": True}, timeout=120) as answer:
        got = b"".join(answer.iter_raw())
    return got, time.perf_counter() - started


def test_a_20_mib_event_is_relayed_as_fast_as_its_bytes_in_small_events_and_others_are_not_held(
    tmp_path: Path, db_url: str
) -> None:
    size = 20 << 20
    big = stream(chunk("Hel"), chunk("lo", size), chunk(" there", finish="length"))
    # The same bytes in events of about 20 KiB: what the relay costs when no event is large.
    pieces = size // (20 << 10)
    small = stream(*(chunk("x", 20 << 10, "length" if n == pieces - 1 else None, "small") for n in range(pieces)),
                   name="small")  # fmt: skip
    engine = Streamer(big)
    env = {"DRAFTWATCH_PROXY_MAX_EVENT_BYTES": str(64 << 20)}
    with (
        serving(engine, log_level="warning") as engine_url,
        sidecar(tmp_path, db_url, engine_url, **env) as (url, app),
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        alone = latencies(client)
        done = threading.Event()
        during: list[float] = []
        other = threading.Thread(target=lambda: during.extend(latencies(client, done)))
        other.start()
        try:
            got, big_s = relayed(url, big)
        finally:
            done.set()
            other.join()
        engine.events = small
        got_small, small_s = relayed(url, small)
        flushed(app)
    # Byte for byte but the usage chunk the client did not ask for, the large event within it.
    assert got == b"".join(big[:-2]) + big[-1]
    assert got_small == b"".join(small[:-2]) + small[-1]
    # The quadratic relay took about 10 s of the loop for this one event, the many small events well under one.
    assert big_s < 2 * small_s + 0.5, (big_s, small_s)
    # Each of the other client's requests was served while the event was in hand, none held for it.
    assert len(during) >= 5
    assert max(during) < 0.25 + 10 * max(alone), (max(during), max(alone))
    assert p99(during) < 0.1 + 10 * p99(alone), (p99(during), p99(alone))
    streamed = {row["request_id"]: row for row in rows(db_url)}
    assert {streamed[f"chatcmpl-{name}"]["finish_reason"] for name in ("big", "small")} == {"length"}
    assert app.state.api.proxy_unrecorded == 0


def test_an_event_past_the_bound_passes_byte_for_byte_with_the_rest_and_the_request_is_counted_unrecorded(
    tmp_path: Path, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    events = stream(chunk("Hel"), chunk("lo", 2 << 20), chunk(" there", finish="length"))
    engine = Streamer(events)
    env = {"DRAFTWATCH_PROXY_MAX_EVENT_BYTES": str(1 << 20)}
    with (
        serving(engine, log_level="warning") as engine_url,
        sidecar(tmp_path, db_url, engine_url, **env) as (url, app),
    ):
        got, _ = relayed(url, events)
        after = httpx.post(f"{url}/v1/chat/completions", json=ASK, timeout=30)
        flushed(app)
    # Every byte in order, the events after the large one included (unread: the usage chunk too).
    assert got == b"".join(events)
    assert after.status_code == 200
    assert app.state.api.proxy_unrecorded == 1
    assert [row["request_id"] for row in rows(db_url)] == [CHAT["id"]]  # the whole chat after it only
    (warning,) = [r.getMessage() for r in caplog.records if "not recorded" in r.getMessage()]
    assert "exceeds proxy.max_event_bytes (1048576 bytes)" in warning and "hello" not in warning


def test_the_cut_events_are_the_ones_sent_whatever_the_pieces(tmp_path: Path, db_url: str) -> None:
    # Events split across reads at every place, ends of both kinds, a comment and a keep-alive between.
    events = [b": keep-alive\n\n", *stream(chunk("Hel"), chunk("lo", 200 << 10, "length"))]
    events[1] = events[1].replace(b"\n\n", b"\r\n\r\n")
    engine = Streamer(events)
    with serving(engine, log_level="warning") as engine_url, sidecar(tmp_path, db_url, engine_url) as (url, app):
        got, _ = relayed(url, events)
        flushed(app)
    assert got == b"".join(events[:-2]) + events[-1]
    assert len(rows(db_url)) == 1 and app.state.api.proxy_unrecorded == 0


class Held:
    """An engine whose answer (JSON, no length) sends ``first`` bytes, then the rest only once the client has them."""

    def __init__(self, first: bytes, rest: bytes) -> None:
        self.first, self.rest = first, rest
        self.seen = threading.Event()  # set by the test once its client has read the first part
        self.waited_out = False  # the client never saw the first part before the answer's end could come

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": self.first, "more_body": True})
        deadline = time.monotonic() + 10
        while not self.seen.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.waited_out = not self.seen.is_set()
        await send({"type": "http.response.body", "body": self.rest})


def read_holding(engine: Held, method: str, url: str, **options: Any) -> bytes:
    """The whole answer, telling the engine once the first part is in."""
    got = b""
    with httpx.stream(method, url, timeout=60, **options) as answer:
        for piece in answer.iter_raw():
            got += piece
            if len(got) >= len(engine.first):
                engine.seen.set()
    return got


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/files/f-1/content"), ("POST", "/v1/chat/completions")])
def test_an_answer_not_recorded_or_past_the_body_bound_streams_through_as_it_comes(
    tmp_path: Path, db_url: str, method: str, path: str
) -> None:
    # A pass-through route's answer is never held; a generation's whole answer past proxy.max_body_bytes passes unread.
    first = b'{"id": "chatcmpl-huge", "choices": [{"text": "' + b"x" * (2 << 20)
    engine = Held(first, b'"}]}')
    env = {"DRAFTWATCH_PROXY_MAX_BODY_BYTES": str(1 << 20)}
    with serving(engine, log_level="warning") as engine_url, sidecar(tmp_path, db_url, engine_url, **env) as (url, app):
        got = read_holding(engine, method, f"{url}{path}", **({"json": ASK} if method == "POST" else {}))
        flushed(app)
    assert got == first + b'"}]}' and not engine.waited_out
    assert rows(db_url) == []
    assert app.state.api.proxy_unrecorded == (1 if method == "POST" else 0)


def test_a_stream_cut_by_the_server_stopping_is_recorded_as_such_not_as_a_client_leaving(
    tmp_path: Path, db_url: str
) -> None:
    engine = Engine()
    engine.event_pause_s = 30.0  # a stream that would outlast the shutdown's limit
    with serving(engine.app(), log_level="warning") as engine_url, sidecar(tmp_path, db_url, engine_url) as (url, app):
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**ASK, "stream": True}, timeout=30) as answer:
            # Held: a bare next(answer.iter_raw()) drops the generator, whose close closes the connection at once,
            # so that the sidecar could see the client leave before the flag below was set.
            events = answer.iter_raw()
            next(events)
            app.state.api.stopping = True  # what the server's shutdown sets past its drain, before it ends the rest
        deadline = time.monotonic() + 30
        while engine.cut_streams == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        flushed(app)
    assert [(row["finish_reason"], row["error"]) for row in rows(db_url)] == [("error", "server shutting down")]


class Models:
    """An engine whose /v1/models lists ``name``, padded with ``padding`` bytes of description."""

    def __init__(self, name: str, padding: int = 0) -> None:
        self.answer = json.dumps({"object": "list", "data": [{"id": name, "object": "model", "about": "x" * padding}]})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": self.answer.encode()})


def test_a_model_list_past_the_body_bound_is_skipped_not_held(tmp_path: Path, db_url: str) -> None:
    env = {"DRAFTWATCH_PROXY_MAX_BODY_BYTES": str(1 << 20)}
    with (
        serving(Models("small"), log_level="warning") as small_url,
        serving(Models("huge", 2 << 20), log_level="warning") as huge_url,
    ):
        table = json.dumps([{"model": "huge*", "upstream": huge_url}])
        with sidecar(tmp_path, db_url, small_url, DRAFTWATCH_PROXY_ROUTES=table, **env) as (url, _):
            listed = httpx.get(f"{url}/v1/models", timeout=30)
    assert listed.status_code == 200
    assert [model["id"] for model in listed.json()["data"]] == ["small"]
