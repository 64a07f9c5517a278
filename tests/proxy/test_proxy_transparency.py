"""The proxy is transparent: compressed bodies, repeated headers, every route and method of the engine, its
own refusals in the OpenAI shape, an engine that refuses stream_options, a stalled body (issue 32)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import openai
import pytest

from tests.api.conftest import READ, auth
from tests.proxy.engine import CHAT, Engine, flushed, rows, serving, sidecar, stream_events


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'proxy.db'}"


@pytest.fixture
def engine() -> Engine:
    return Engine()


@pytest.fixture
def engine_url(engine: Engine) -> object:
    with serving(engine.app()) as url:
        yield url


def test_a_compressing_engine_is_read_by_the_openai_client_streams_included(
    tmp_path: Path, db_url: str, engine: Engine, engine_url: str
) -> None:
    engine.compress = True
    with sidecar(tmp_path, db_url, engine_url) as (url, app):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="engine-key", max_retries=0)
        whole = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        stream = client.chat.completions.create(model="m", messages=[], stream=True)
        pieces = [chunk.choices[0].delta.content for chunk in stream if chunk.choices]
        flushed(app)
    assert whole.id == CHAT["id"] and pieces == ["Hel", "lo", " there"]
    # The whole body came compressed (the client asked for gzip); the stream was asked for identity.
    accepted = [dict(headers).get(b"accept-encoding") for _, _, headers, _ in engine.seen]
    assert accepted[0] is not None and b"gzip" in accepted[0] and accepted[1] == b"identity"
    stored = sorted(rows(db_url), key=lambda r: r["request_id"])
    assert [(r["request_id"], r["error"]) for r in stored] == [(CHAT["id"], None), ("chatcmpl-e1", None)]
    assert stored[0]["num_draft_tokens"] == 129 and stored[1]["num_draft_tokens"] == 129


def test_a_compressed_body_passes_with_its_encoding_and_a_gzipped_stream_is_relayed_decoded(
    tmp_path: Path, db_url: str, engine: Engine, engine_url: str
) -> None:
    engine.compress = True
    body = {"model": "m", "messages": [], "stream": True, "stream_options": {"include_usage": True}}
    with sidecar(tmp_path, db_url, engine_url) as (url, app), httpx.Client(base_url=url) as client:
        whole = client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        raw = client.send(client.build_request("POST", "/v1/chat/completions", json={"model": "m", "messages": []}),
                          stream=True)  # fmt: skip
        compressed = b"".join(raw.iter_raw())
        raw.close()
        # An engine that compresses a stream whatever it is asked: decoded here, relayed as identity.
        engine.ignore_accept_encoding = True
        streamed = client.post("/v1/chat/completions", json=body, headers={"accept-encoding": "identity, gzip"})
        flushed(app)
    assert whole.json() == CHAT and raw.headers["content-encoding"] == "gzip"
    assert json.loads(gzip.decompress(compressed)) == CHAT  # untouched, with its Content-Encoding
    assert "content-encoding" not in streamed.headers and streamed.text.endswith("data: [DONE]\n\n")
    assert b"".join(stream_events(usage=True)).decode() == streamed.text  # the client asked for usage
    stored = {r["request_id"]: r for r in rows(db_url)}  # the two whole answers share their id: one row
    assert stored.keys() == {CHAT["id"], "chatcmpl-e1"} and stored["chatcmpl-e1"]["error"] is None


def test_a_gzipped_request_body_goes_upstream_with_its_header_and_is_read_for_the_record(
    tmp_path: Path, db_url: str, engine: Engine, engine_url: str
) -> None:
    payload = {"model": "qwen-7b", "messages": [], "metadata": {"workload": "code"}}
    compressed = gzip.compress(json.dumps(payload).encode())
    headers = {"content-encoding": "gzip", "content-type": "application/json"}
    with sidecar(tmp_path, db_url, engine_url) as (url, app):
        response = httpx.post(f"{url}/v1/chat/completions", content=compressed, headers=headers)
        flushed(app)
    assert response.status_code == 200
    _, _, seen_headers, seen_body = engine.seen[-1]
    assert seen_body == compressed and (b"content-encoding", b"gzip") in seen_headers
    (row,) = rows(db_url)
    assert (row["workload"], row["target_model"]) == ("code", "qwen-7b")


def test_repeated_headers_pass_both_ways_and_one_date_comes_back(
    tmp_path: Path, db_url: str, engine: Engine, engine_url: str
) -> None:
    with sidecar(tmp_path, db_url, engine_url) as (url, _):
        sent = [("x-foo", "one"), ("x-foo", "two"), ("x-workload", "code"), ("x-draftwatch-token", "t")]
        response = httpx.get(f"{url}/v1/cookies", headers=sent)
    assert response.status_code == 200
    assert response.headers.get_list("set-cookie") == ["a=0", "b=1", "c=2"]
    assert len(response.headers.get_list("date")) == 1
    _, _, seen, _ = engine.seen[-1]
    assert [v for k, v in seen if k == b"x-foo"] == [b"one", b"two"]
    assert not {b"x-workload", b"x-draftwatch-token"} & {k for k, _ in seen}


def test_every_route_and_method_of_the_engine_is_forwarded_unrecorded_and_draftwatchs_stay_its_own(
    tmp_path: Path, db_url: str, engine: Engine, engine_url: str
) -> None:
    forwarded = [
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/audio/transcriptions"),
        ("POST", "/v1/rerank"),
        ("POST", "/tokenize"),
        ("GET", "/v1/models/m"),
        ("GET", "/health"),
        ("OPTIONS", "/v1/chat/completions"),
        ("DELETE", "/v1/files/f1"),
    ]
    with sidecar(tmp_path, db_url, engine_url) as (url, app), httpx.Client(base_url=url) as client:
        answers = [client.request(method, path, json={"input": "x"}) for method, path in forwarded]
        head = client.head("/health")
        own = [client.get(path, headers=auth(READ)) for path in ("/healthz", "/metrics", "/v1/workloads")]
        wrong_method = client.post("/metrics")
        flushed(app)
    assert [a.json() for a in answers] == [{"path": p, "method": m} for m, p in forwarded]
    assert head.status_code == 200 and head.headers["x-engine"] == "yes"
    assert head.headers["content-length"] == str(len(b'{"path":"/health","method":"HEAD"}'))
    assert all(a.status_code == 200 and "x-engine" not in a.headers for a in own)
    assert wrong_method.status_code == 405 and "x-engine" not in wrong_method.headers
    assert len(engine.seen) == len(forwarded) + 1
    assert rows(db_url) == []  # nothing but generations is recorded


def test_the_proxys_own_refusals_are_openai_errors_and_its_body_limit_is_its_own(
    tmp_path: Path, db_url: str, engine: Engine, engine_url: str
) -> None:
    env = {"DRAFTWATCH_API_MAX_BODY_BYTES": "1024", "DRAFTWATCH_PROXY_MAX_BODY_BYTES": "65536"}
    long_prompt = {"model": "m", "messages": [{"role": "user", "content": "x" * 20_000}]}
    with sidecar(tmp_path, db_url, engine_url, **env) as (url, _), httpx.Client(base_url=url) as client:
        passed = client.post("/v1/chat/completions", json=long_prompt)
        too_large = client.post("/v1/embeddings", content=b"x" * 70_000)
        own_too_large = client.post("/v1/events", content=b"x" * 2048)
    tokens = "proxy:proxy-token-0123456789,read:read-token-0123456789ab"
    with sidecar(tmp_path, db_url, engine_url, DRAFTWATCH_API_TOKENS=tokens) as (url, _):
        missing = httpx.post(f"{url}/v1/embeddings", json={})
        wrong = httpx.post(
            f"{url}/v1/chat/completions", json={}, headers={"x-draftwatch-token": "read-token-0123456789ab"}
        )
    assert passed.status_code == 200  # over api.max_body_bytes, under proxy.max_body_bytes
    for refused, status in ((too_large, 413), (missing, 401), (wrong, 403)):
        assert refused.status_code == status
        assert set(refused.json()["error"]) == {"message", "type", "code"}, refused.text
    assert own_too_large.json()["error"] == "body_too_large"  # draftwatch's own routes keep their shape


def test_an_engine_refusing_stream_options_gets_the_stream_again_without_them_and_is_not_asked_again(
    tmp_path: Path, db_url: str, engine: Engine, engine_url: str
) -> None:
    engine.refuse_stream_options = True
    body = {"model": "m", "messages": [], "stream": True}
    with sidecar(tmp_path, db_url, engine_url) as (url, app), httpx.Client(base_url=url) as client:
        streams = [client.post("/v1/chat/completions", json=body) for _ in range(2)]
        flushed(app)
    assert [s.status_code for s in streams] == [200, 200]
    assert all(s.text.endswith("data: [DONE]\n\n") and '"Hel"' in s.text for s in streams)
    sent = [json.loads(raw) for _, _, _, raw in engine.seen]
    assert ["stream_options" in b for b in sent] == [True, False, False]
    stored = rows(db_url)  # recorded from what the stream carries (llama.cpp's timings)
    assert len(stored) == 2 and all(r["error"] is None and r["num_draft_tokens"] == 60 for r in stored)


def test_a_stalled_generation_is_a_504_whose_record_names_the_stack(
    tmp_path: Path, db_url: str, engine: Engine, engine_url: str
) -> None:
    engine.event_pause_s = 3.0
    env = {"DRAFTWATCH_PROXY_TIMEOUT_S": "0.5"}
    with sidecar(tmp_path, db_url, engine_url, **env) as (url, app), httpx.Client(base_url=url) as client:
        first = client.post("/v1/completions", json={"model": "m", "prompt": "hi"})  # the stall, before any answer
        chat = client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        second = client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        flushed(app)
    assert (first.status_code, chat.status_code, second.status_code) == (504, 200, 504)
    assert first.json()["error"]["type"] == "upstream_timeout"
    by_time = sorted(rows(db_url), key=lambda r: r["ts_start"])
    assert [(r["source"], r["error"]) for r in by_time] == [
        ("proxy:auto", "upstream timed out"),  # nothing told the stack yet
        ("proxy:vllm", None),
        ("proxy:vllm", "upstream timed out"),
    ]
