"""Large request bodies are read for their few fields without holding the others; an unreadable generation is a 400.

``json.loads`` holds the GIL for a body's whole length, in a worker thread too (16 concurrent 30 MiB
bodies gave other clients a p99 of 949 ms), and a streamed body was re-serialised whole on the event
loop to add ``stream_options``. A body the proxy could not read went to the default pool whatever model
it named, and its failure there counted against that replica. Stand-in engines on real ports.
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from tests.proxy.engine import CHAT, flushed, latencies, p99, rows, sidecar
from tests.proxy.test_health import metric
from tests.serving import free_port, serve_process, serving

ASK = {"model": "qwen-coder", "messages": [{"role": "user", "content": "hi"}]}
USAGE = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": CHAT["model"], "choices": [],
         "usage": CHAT["usage"], "metrics": CHAT["metrics"]}  # fmt: skip
FINISH = {**USAGE, "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "length"}], "usage": None}


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'proxy.db'}"


# A turn that a byte scanner must read with care: quotes, brackets and backslashes in a string, non-ASCII.
TRICKY = {"role": "user", "content": 'a "turn" with ] } [ { \\" and ünïcode'}


def conversation(size: int, turn: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    """A chat of about ``size`` bytes of short turns (what makes a parse slow), ``fields`` after the messages."""
    turn = turn or {"role": "user", "content": "a"}
    return {"model": "qwen-coder", "messages": [turn] * (size // len(json.dumps(turn))), **fields}


class Bodies:
    """An engine that keeps each body as it came and answers a chat; ``digests``: only each body's digest is kept,
    in pieces, so that a test timing the sidecar does not time the stand-in's copies."""

    def __init__(self, *, digests: bool = False) -> None:
        self.seen: list[tuple[str, bytes]] = []
        self.digests = digests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        digest = hashlib.sha256()
        pieces = []
        while True:
            message = await receive()
            piece = message.get("body", b"")
            digest.update(piece)
            if not self.digests:
                pieces.append(piece)
            if not message.get("more_body"):
                break
        body = digest.digest() if self.digests else b"".join(pieces)
        self.seen.append((scope["path"], body))
        if b'"stream": true' in body[-200:]:
            events = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in (FINISH, USAGE))
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
            await send({"type": "http.response.body", "body": events + b"data: [DONE]\n\n"})
            return
        content = json.dumps(CHAT).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": content})


def test_concurrent_30_mib_bodies_do_not_hold_another_clients_small_requests(tmp_path: Path, db_url: str) -> None:
    large = json.dumps(conversation(30 << 20)).encode()
    engine = Bodies(digests=True)
    port = free_port()
    # The sidecar in a process of its own: in this one, the clients and the engine share its GIL.
    with serving(engine, log_level="warning") as engine_url:
        process = serve_process(tmp_path, db_url, port, DRAFTWATCH_PROXY_UPSTREAM=engine_url)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                alone = latencies(client)
                done = threading.Event()
                during: list[float] = []
                other = threading.Thread(target=lambda: during.extend(latencies(client, done)))
                other.start()
                statuses: list[int] = []

                def send_large() -> None:
                    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as own:
                        statuses.extend(own.post("/v1/chat/completions", content=large).status_code for _ in range(2))

                senders = [threading.Thread(target=send_large) for _ in range(4)]
                try:
                    for sender in senders:
                        sender.start()
                    for sender in senders:
                        sender.join()
                finally:
                    done.set()
                    other.join()
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
    assert statuses == [200] * 8
    assert sum(1 for _, body in engine.seen if body == hashlib.sha256(large).digest()) == 8
    # The old proxy's json.loads of each body held the GIL, and every other request with it, this long.
    started = time.perf_counter()
    json.loads(large)
    parse_s = time.perf_counter() - started
    assert len(during) >= 5
    assert max(during) < parse_s / 2 + 10 * max(alone), (max(during), parse_s, max(alone))
    assert p99(during) < parse_s / 2 + 10 * p99(alone), (p99(during), parse_s, p99(alone))


@pytest.mark.parametrize("options", [None, {"continuous_usage_stats": False}])
def test_a_large_streamed_body_gets_stream_options_spliced_in_and_every_other_byte_as_sent(
    tmp_path: Path, db_url: str, options: dict[str, Any] | None
) -> None:
    fields: dict[str, Any] = {"stream": True} if options is None else {"stream_options": options, "stream": True}
    payload = conversation(8 << 20, TRICKY, **fields)
    # As a client may write it: blanks, non-ASCII unescaped, which a re-serialised body would not keep.
    sent = json.dumps(payload, ensure_ascii=False, indent=1).encode()
    engine = Bodies()
    with serving(engine, log_level="warning") as engine_url, sidecar(tmp_path, db_url, engine_url) as (url, app):
        with httpx.stream("POST", f"{url}/v1/chat/completions", content=sent, timeout=60) as answer:
            got = b"".join(answer.iter_raw())
        flushed(app)
    ((_, upstream),) = engine.seen
    assert json.loads(upstream) == {**payload, "stream_options": {**(options or {}), "include_usage": True}}
    value = json.dumps({**(options or {}), "include_usage": True}, separators=(",", ":")).encode()
    if options is None:  # inserted before the object's end
        end = sent.rindex(b"}")
        assert upstream == sent[:end] + b',"stream_options":' + value + sent[end:]
    else:  # the client's value replaced where it wrote it
        start = sent.index(b'"stream_options": ') + len(b'"stream_options": ')
        assert upstream == sent[:start] + value + sent[sent.index(b"}", start) + 1 :]
    # The usage chunk the client did not ask for is taken out, and the stream recorded from it.
    assert b'"usage": {' not in got and got.endswith(b"data: [DONE]\n\n")
    (row,) = rows(db_url)
    assert row["finish_reason"] == "length" and row["output_tokens"] == CHAT["usage"]["completion_tokens"]


def test_a_large_bodys_workload_and_model_are_read_past_its_large_values(tmp_path: Path, db_url: str) -> None:
    default, routed = Bodies(), Bodies()
    large = conversation(8 << 20, TRICKY, metadata={"workload": "long-chat"}, temperature=0.3, user="u1")
    large["model"] = "llama-3-8b"
    # The model named last, after the large values, as a client may order its fields.
    sent = json.dumps({k: v for k, v in large.items() if k != "model"} | {"model": "llama-3-8b"}).encode()
    with (
        serving(default, log_level="warning") as default_url,
        serving(routed, log_level="warning") as routed_url,
    ):
        table = json.dumps([{"model": "llama-*", "upstream": routed_url}])
        with sidecar(tmp_path, db_url, default_url, DRAFTWATCH_PROXY_ROUTES=table) as (url, app):
            answer = httpx.post(f"{url}/v1/chat/completions", content=sent, timeout=60)
            flushed(app)
    assert answer.status_code == 200
    assert default.seen == [] and routed.seen == [("/v1/chat/completions", sent)]
    (row,) = rows(db_url)
    assert (row["workload"], row["target_model"], row["temperature"]) == ("long-chat", "llama-3-8b", 0.3)


UNREADABLE = {
    "invalid UTF-8": b'{"model": "qwen-coder", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
    "UTF-16": json.dumps(ASK).encode("utf-16"),
    "nested too deep": b'{"model": "qwen-coder", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "not an object": json.dumps([ASK]).encode(),
    "not JSON": b'{"model": "qwen-coder", "messages": [',
    "large, invalid UTF-8": json.dumps(conversation(2 << 20, TRICKY)).encode()[:-2] + b'"\xc3"}',
}


def test_a_generation_whose_body_cannot_be_read_is_a_400_that_reaches_no_replica(tmp_path: Path, db_url: str) -> None:
    engine = Bodies()
    env = {"DRAFTWATCH_PROXY_EJECT_AFTER": "1", "DRAFTWATCH_PROXY_EJECT_COOLDOWN_S": "600"}
    upload = b"\xff\xd8\xff" + bytes(range(256)) * 4096  # an upload, JSON or not, is the engine's to read
    with serving(engine, log_level="warning") as engine_url, sidecar(tmp_path, db_url, engine_url, **env) as (url, app):
        netloc = engine_url.removeprefix("http://")
        with httpx.Client(base_url=url, timeout=60) as client:
            refused = {case: client.post("/v1/chat/completions", content=body) for case, body in UNREADABLE.items()}
            up = metric(url, netloc)
            passed = client.post("/v1/audio/transcriptions", content=upload)
            answered = client.post("/v1/chat/completions", json=ASK)
        flushed(app)
    assert {case: r.status_code for case, r in refused.items()} == dict.fromkeys(UNREADABLE, 400)
    assert refused["UTF-16"].json() == {"error": {"message": "a generation's body must be one JSON object in UTF-8",
                                                  "type": "invalid_request_error", "code": "invalid_body"}}  # fmt: skip
    assert up == "1"
    assert passed.status_code == 200 and answered.status_code == 200
    assert [path for path, _ in engine.seen] == ["/v1/audio/transcriptions", "/v1/chat/completions"]
    assert engine.seen[0][1] == upload
    assert len(rows(db_url)) == 1 and app.state.api.proxy_unrecorded == 0
