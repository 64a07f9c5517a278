"""Proxy mode in front of SGLang's OpenAI routes: the counts are asked for, recorded, and taken out again.

The stand-in answers as SGLang does (sgl-project/sglang 004c82e0: per-choice ``meta_info`` on a
non-streamed chat with ``return_meta_info``, a 400 for that flag on a stream; SGLang PR #33518:
``sglext.spec_tokens_details`` with ``return_spec_tokens_details``, in a stream on an event of its
own before the usage chunk), in SGLang's compact JSON. Each test asks the stand-in directly for
what the client would have got without draftwatch and compares bytes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.proxy.test_proxy import flush, rows
from tests.proxy.upstream import fixture, proxy_sidecar
from tests.serving import serving

META = fixture("sglang", "chat-meta-info")["response"]["choices"][0]["meta_info"]
DETAILS = fixture("sglang", "completions-spec-tokens-details")["response"]["sglext"]["spec_tokens_details"]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class Sglang:
    """SGLang's OpenAI-compatible chat and completions, answering with the fixtures' counts."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def app(self) -> Starlette:
        return Starlette(routes=[Route(p, self._answer, methods=["POST"]) for p in ("/v1/chat/completions",
                                                                                      "/v1/completions")])  # fmt: skip

    async def _answer(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.seen.append(body)
        chat = request.url.path == "/v1/chat/completions"
        if body.get("stream"):
            if chat and body.get("return_meta_info"):
                error = {"object": "error", "message": "return_meta_info is not supported with streaming.",
                         "type": "BadRequest", "param": None, "code": 400}  # fmt: skip
                return Response(compact(error), 400, media_type="application/json")
            return StreamingResponse(self._events(body, chat), media_type="text/event-stream")
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length", "matched_stop": None}
        choice |= {"message": {"role": "assistant", "content": "Hello there"}} if chat else {"text": "Hello there"}
        if chat and body.get("return_meta_info"):
            choice["meta_info"] = META
        answer: dict[str, Any] = {"id": META["id"], "object": "chat.completion" if chat else "text_completion",
                                  "created": 1748736001, "model": MODEL, "choices": [choice],
                                  "usage": {"prompt_tokens": 20, "total_tokens": 50, "completion_tokens": 30,
                                            "prompt_tokens_details": None, "reasoning_tokens": 0},
                                  "metadata": {"weight_version": "default"}}  # fmt: skip
        if body.get("return_spec_tokens_details"):
            answer["sglext"] = {"spec_tokens_details": DETAILS}
        return Response(compact(answer), media_type="application/json")

    async def _events(self, body: dict[str, Any], chat: bool) -> AsyncIterator[bytes]:
        base = {"id": "s1", "object": "chat.completion.chunk" if chat else "text_completion", "created": 1,
                "model": MODEL}  # fmt: skip
        for number, piece in enumerate(["Hel", "lo", " there"]):
            finish = "length" if number == 2 else None
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            yield (
                b"data: " + compact({**base, "choices": [{**choice, "finish_reason": finish}], "usage": None}) + b"\n\n"
            )
        if body.get("return_spec_tokens_details"):
            yield b"data: " + compact(
                {**base, "choices": [], "usage": None, "sglext": {"spec_tokens_details": DETAILS}}
            )
            yield b"\n\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 20, "total_tokens": 50, "completion_tokens": 30}
            yield b"data: " + compact({**base, "choices": [], "usage": usage}) + b"\n\n"
        yield b"data: [DONE]\n\n"


@pytest.fixture
def sglang() -> Iterator[tuple[Sglang, str]]:
    stub = Sglang()
    with serving(stub.app()) as url:
        yield stub, url


def unproxied(url: str, path: str, body: dict[str, Any]) -> bytes:
    """What the client would have read from SGLang itself."""
    return httpx.post(f"{url}{path}", json=body, timeout=30).content


SGLANG = {"DRAFTWATCH_PROXY_KIND": "sglang", "DRAFTWATCH_PROXY_SPECULATIVE": "true"}
EXPECTED = {"num_draft_tokens": 30, "num_accepted_tokens": 19, "num_spec_steps": 10, "num_speculative_tokens": 3,
            "acceptance_histogram": [1, 2, 4, 3], "accepted_per_position": [9, 7, 3]}  # fmt: skip


def _recorded(db_url: str) -> dict[str, Any]:
    (row,) = rows(db_url)
    return {k: row[k] for k in EXPECTED}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_non_streamed_answer_reaches_the_client_as_sglang_wrote_it_and_its_counts_the_record(
    tmp_path: Path, sglang: tuple[Sglang, str], path: str
) -> None:
    stub, url = sglang
    db_url = f"sqlite:///{tmp_path / 'dw.db'}"
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 30}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    with proxy_sidecar(tmp_path, db_url, url, **SGLANG) as client:
        response = client.post(path, json=body)
        flush(client)
    asked = stub.seen[-1]
    assert asked["return_spec_tokens_details"] is True
    assert asked.get("return_meta_info") is ("chat" in path or None)
    assert response.status_code == 200
    assert response.content == unproxied(url, path, body)
    assert _recorded(db_url) == EXPECTED


def test_a_stream_loses_the_event_that_only_carried_the_counts(tmp_path: Path, sglang: tuple[Sglang, str]) -> None:
    stub, url = sglang
    db_url = f"sqlite:///{tmp_path / 'dw.db'}"
    # The client asked for usage itself: only the details' event is the proxy's to take out.
    body = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    with proxy_sidecar(tmp_path, db_url, url, **SGLANG) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            received = b"".join(response.iter_raw())
        flush(client)
    asked = stub.seen[-1]
    # A streamed chat is not asked for meta_info: SGLang would refuse the request.
    assert asked["return_spec_tokens_details"] is True and "return_meta_info" not in asked
    assert response.status_code == 200
    assert received == unproxied(url, "/v1/chat/completions", body)
    assert b"spec_tokens_details" not in received and b'"usage":{' in received
    assert _recorded(db_url) == EXPECTED
    (row,) = rows(db_url)
    assert (row["output_tokens"], row["finish_reason"], row["source"]) == (30, "length", "proxy:sglang")


def test_a_client_that_asked_for_the_details_keeps_them(tmp_path: Path, sglang: tuple[Sglang, str]) -> None:
    _, url = sglang
    db_url = f"sqlite:///{tmp_path / 'dw.db'}"
    body = {"model": MODEL, "prompt": "hi", "return_spec_tokens_details": True}
    with proxy_sidecar(tmp_path, db_url, url, **SGLANG) as client:
        response = client.post("/v1/completions", json=body)
        flush(client)
    assert response.content == unproxied(url, "/v1/completions", body)
    assert response.json()["sglext"]["spec_tokens_details"] == DETAILS
    assert _recorded(db_url) == EXPECTED
