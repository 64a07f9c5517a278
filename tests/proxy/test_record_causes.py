"""What a proxied request's record carries for the causes of a drop: the replica, the prefix cache's share of the
prompt, the style fingerprint and the answer's copy share, from vLLM-, llama.cpp- and SGLang-shaped answers."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.proxy.engine import flushed, rows, sidecar
from tests.serving import serving

SYSTEM = {"role": "system", "content": "You answer with code only."}
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
CAUSES = ("replica", "cached_prompt_tokens", "style_hash", "prompt_copy_share")


def prose(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(40)) for _ in range(words))


class Engine:
    """Answers in the shape of ``stack``: with the prompt's own text (``COPY`` in the user's turn) or other text."""

    def __init__(self) -> None:
        self.stack = "vllm"
        self.cached: int | None = 24
        self.other = prose(99, 120)
        self.copy_words: int | None = None  # how much of the prompt a copying answer repeats (None: all)
        self.answered = 0  # each answer its own id: the store keeps one record per id

    def app(self) -> Starlette:
        routes = [Route(p, self._answer, methods=["POST"]) for p in ("/v1/chat/completions", "/generate")]
        return Starlette(routes=routes)

    def _text(self, body: dict[str, Any]) -> str:
        asked = body["text"] if "text" in body else body["messages"][-1]["content"]
        if not asked.startswith("COPY "):
            return self.other
        return " ".join(asked.removeprefix("COPY ").split(" ")[: self.copy_words])

    async def _answer(self, request: Request) -> Response:
        body = json.loads(await request.body())
        text = self._text(body)
        self.answered += 1
        answer_id = f"answer-{self.answered}"
        if request.url.path == "/generate":
            meta = {"id": answer_id, "prompt_tokens": 60, "completion_tokens": 30, "finish_reason": {"type": "stop"}}
            return JSONResponse({"text": text, "meta_info": {**meta, "cached_tokens": self.cached}})
        usage: dict[str, Any] = {"prompt_tokens": 60, "completion_tokens": 30, "total_tokens": 90}
        report: dict[str, Any] = {"usage": usage}
        if self.stack == "vllm" and self.cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached}
        if self.stack == "llamacpp":
            timings = {"prompt_n": 60 - (self.cached or 0), "prompt_ms": 5.0, "predicted_n": 30, "predicted_ms": 50.0}
            report["timings"] = {**timings, **({} if self.cached is None else {"cache_n": self.cached})}
        base = {"id": answer_id, "object": "chat.completion", "model": "m"}
        if not body.get("stream"):
            message = {"role": "assistant", "content": text}
            return JSONResponse(
                {**base, **report, "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
            )

        async def events() -> AsyncIterator[bytes]:
            words = text.split(" ")
            for i in range(0, len(words), 7):  # pieces as an engine streams them, spaces included
                piece = " ".join(words[i : i + 7]) + (" " if i + 7 < len(words) else "")
                choice = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                yield f"data: {json.dumps({**base, 'choices': [choice]})}\n\n".encode()
            last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            yield f"data: {json.dumps(last)}\n\n".encode()
            yield f"data: {json.dumps({**base, 'choices': [], **report})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def recorded(db_url: str) -> dict[str, dict[str, Any]]:
    """Each record's cause fields, by the order the requests were sent (ts_start)."""
    stored = sorted(rows(db_url), key=lambda row: row["ts_start"])
    return {str(i): {k: row[k] for k in CAUSES} for i, row in enumerate(stored)}


@pytest.mark.parametrize("stack", ["vllm", "llamacpp"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_answer_records_each_cause_field(tmp_path: Path, db_url: str, stack: str, stream: bool) -> None:
    engine = Engine()
    engine.stack = stack
    source = prose(1, 300)
    with serving(engine.app(), log_level="warning") as engine_url, sidecar(tmp_path, db_url, engine_url) as (url, app):
        with httpx.Client(base_url=url, timeout=30) as client:
            for asked, cached in ((f"COPY {source}", 24), ("write something new", None), ("again new", 0)):
                engine.cached = cached
                ask = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": asked}], "stream": stream}
                assert client.post("/v1/chat/completions", json=ask).status_code == 200
            other_system = {"role": "system", "content": "You answer in prose."}
            ask = {"model": "m", "messages": [other_system, {"role": "user", "content": "again new"}], "stream": stream}
            assert client.post("/v1/chat/completions", json=ask).status_code == 200
        flushed(app)
    got = recorded(db_url)
    replica = urlsplit(engine_url).netloc
    assert [r["replica"] for r in got.values()] == [replica] * 4
    assert [r["cached_prompt_tokens"] for r in got.values()] == [24, None, 0, 0]  # absent: NULL, never 0
    styles = [r["style_hash"] for r in got.values()]
    assert styles[0] == styles[1] == styles[2] and len(styles[0]) == 12  # only the user's text changed
    assert styles[3] != styles[0]  # a new system prompt
    shares = [r["prompt_copy_share"] for r in got.values()]
    assert shares[0] == pytest.approx(1.0) and shares[1] == pytest.approx(0.0, abs=0.05)


def test_sglangs_native_answer_records_its_cached_tokens_and_no_style(tmp_path: Path, db_url: str) -> None:
    engine = Engine()
    source = prose(2, 200)
    with serving(engine.app(), log_level="warning") as engine_url, sidecar(tmp_path, db_url, engine_url) as (url, app):
        engine.cached = 7
        assert httpx.post(f"{url}/generate", json={"text": f"COPY {source}"}, timeout=30).status_code == 200
        engine.cached = None
        assert httpx.post(f"{url}/generate", json={"text": "something new"}, timeout=30).status_code == 200
        flushed(app)
    got = recorded(db_url)
    # A plain prompt has no template: no style fingerprint, rather than a hash that changes with every prompt.
    assert got["0"] == {"replica": urlsplit(engine_url).netloc, "cached_prompt_tokens": 7, "style_hash": None,
                        "prompt_copy_share": pytest.approx(1.0)}  # fmt: skip
    assert got["1"]["cached_prompt_tokens"] is None and got["1"]["prompt_copy_share"] == pytest.approx(0.0, abs=0.05)


@pytest.mark.parametrize("stream", [False, True])
def test_a_large_prompt_and_answer_get_their_share_off_the_event_loop(
    tmp_path: Path, db_url: str, stream: bool
) -> None:
    # Past INLINE_TEXT_CHARS the share is computed by the worker; with the spool first, the reply waits for it.
    engine = Engine()
    engine.copy_words = 5000  # about 40 KB of answer (a whole answer past 64 KiB is read without its text)
    source = prose(3, 30_000)  # about 200 KB of prompt: its first 64 KiB are read
    env = {"DRAFTWATCH_RECORDER_SPOOL_BEFORE_REPLY": "true"}
    with (
        serving(engine.app(), log_level="warning") as engine_url,
        sidecar(tmp_path, db_url, engine_url, **env) as (
            url,
            app,
        ),
    ):
        ask = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": f"COPY {source}"}], "stream": stream}
        assert httpx.post(f"{url}/v1/chat/completions", json=ask, timeout=30).status_code == 200
        flushed(app)
    assert any(thread.name.startswith("draftwatch-causes") for thread in threading.enumerate())
    (row,) = rows(db_url)
    assert row["prompt_copy_share"] == pytest.approx(1.0)
    assert row["style_hash"] is not None and row["cached_prompt_tokens"] == 24
