"""Proxy mode against a real HTTP upstream: what the client gets is the upstream's, what is stored is its report."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from monitor.api.app import create_app
from tests.api.conftest import make_settings, stored
from tests.proxy.engine import rows
from tests.proxy.upstream import Upstream, proxy_sidecar
from tests.serving import free_port


def flush(client: TestClient) -> None:
    assert client.app.state.api.recorder.flush(10)  # type: ignore[attr-defined]


def test_a_non_streamed_chat_passes_through_and_is_recorded(
    tmp_path: Path, db_url: str, upstream: tuple[Upstream, str]
) -> None:
    stub, url = upstream
    body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": "Bearer upstream-key", "X-Workload": "code"}
    with proxy_sidecar(tmp_path, db_url, url) as client:
        response = client.post("/v1/chat/completions", json=body, headers=headers)
        flush(client)
    assert response.status_code == 200 and response.json() == stub.chat
    path, seen_headers, seen_body = stub.seen[-1]
    # The client's own credentials go upstream; the workload tag is the sidecar's and does not.
    assert seen_headers["authorization"] == "Bearer upstream-key" and "x-workload" not in seen_headers
    assert (path, seen_body) == ("/v1/chat/completions", body)
    row = stored(db_url, "chatcmpl-abc123")
    expected = {"workload": "code", "mode": "speculative", "prompt_tokens": 42, "output_tokens": 54}
    expected |= {"num_draft_tokens": 129, "num_accepted_tokens": 10, "num_spec_steps": 43, "source": "proxy:vllm"}
    assert {k: row[k] for k in expected} == expected
    assert row["finish_reason"] == "length" and row["latency_ms"] > 0


def test_a_stream_is_relayed_event_by_event_with_the_usage_it_did_not_ask_for_taken_out(
    tmp_path: Path, db_url: str, upstream: tuple[Upstream, str]
) -> None:
    stub, url = upstream
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}], "user": "bot-7"}
    rules = "model:other*=chat;user:bot-*=batch"
    with proxy_sidecar(tmp_path, db_url, url, DRAFTWATCH_PROXY_WORKLOAD_RULES=rules) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            received = b"".join(response.iter_raw())
        flush(client)
    assert response.headers["content-type"].startswith("text/event-stream")
    # What the client gets is exactly the stream it asked for: the events without the usage chunk.
    assert received == b"".join(stub.stream_events(usage=False))
    assert stub.seen[-1][2]["stream_options"] == {"include_usage": True}  # type: ignore[index]
    (row,) = rows(db_url)
    assert (row["workload"], row["request_id"], row["finish_reason"]) == ("batch", "chatcmpl-s1", "length")
    assert (row["num_draft_tokens"], row["num_accepted_tokens"], row["output_tokens"]) == (129, 10, 54)
    assert row["ttft_ms"] is not None and 0 < row["ttft_ms"] <= row["latency_ms"]


def test_a_client_that_asked_for_usage_keeps_it(tmp_path: Path, db_url: str, upstream: tuple[Upstream, str]) -> None:
    stub, url = upstream
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "messages": []}
    with (
        proxy_sidecar(tmp_path, db_url, url) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        received = b"".join(response.iter_raw())
    assert received == b"".join(stub.stream_events(usage=True))


def test_native_endpoints_and_models_pass_through(tmp_path: Path, db_url: str, upstream: tuple[Upstream, str]) -> None:
    stub, url = upstream
    with proxy_sidecar(tmp_path, db_url, url, DRAFTWATCH_PROXY_DEFAULT_WORKLOAD="rag") as client:
        generated = client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 8}})
        models = client.get("/v1/models")
        flush(client)
    assert generated.json() == stub.generate and models.json()["data"][0]["id"] == stub.chat["model"]
    (row,) = rows(db_url)  # /v1/models is forwarded, not a request to record
    assert (row["workload"], row["source"]) == ("rag", "proxy:sglang")
    assert row["target_model"] == f"auto@{url.removeprefix('http://')}"  # SGLang names no model


def test_upstream_errors_are_forwarded_and_recorded(
    tmp_path: Path, db_url: str, upstream: tuple[Upstream, str]
) -> None:
    stub, url = upstream
    stub.fail_with = 503
    with proxy_sidecar(tmp_path, db_url, url) as client:
        response = client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        flush(client)
    assert response.status_code == 503 and response.json()["error"]["message"] == "model overloaded"
    (row,) = rows(db_url)
    assert (row["finish_reason"], row["error"], row["workload"]) == ("error", "upstream status 503", "default")


def test_an_answered_and_a_failed_request_are_recorded_in_one_shape(
    tmp_path: Path, db_url: str, upstream: tuple[Upstream, str]
) -> None:
    # One builder for both: the sampling settings asked for, the replica's load, and a latency that is
    # ts_end - ts_start (one reading of the clock), whether the engine answered or not.
    stub, url = upstream
    body = {"model": "m", "messages": [], "temperature": 0.7, "top_p": 0.9}
    with proxy_sidecar(tmp_path, db_url, url) as client:
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        stub.fail_with = 503
        assert client.post("/v1/chat/completions", json=body).status_code == 503
        flush(client)
    answered, failed = sorted(rows(db_url), key=lambda row: row["finish_reason"] == "error")
    assert (failed["finish_reason"], failed["error"], answered["error"]) == ("error", "upstream status 503", None)
    for row in (answered, failed):
        assert (row["temperature"], row["top_p"], row["upstream_inflight"], row["drafter"]) == (0.7, 0.9, 1, "upstream")
        assert row["latency_ms"] == pytest.approx((row["ts_end"] - row["ts_start"]).total_seconds() * 1000, abs=1e-6)
        assert row["source"] == "proxy:vllm"
    assert {k for k, v in answered.items() if v is None} - {k for k, v in failed.items() if v is None} == {"error"}


def test_an_unreachable_upstream_gives_502_in_the_openai_shape(tmp_path: Path, db_url: str) -> None:
    with proxy_sidecar(tmp_path, db_url, f"http://127.0.0.1:{free_port()}") as client:
        response = client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        flush(client)
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "upstream_unavailable"
    (row,) = rows(db_url)
    assert row["finish_reason"] == "error" and row["error"].startswith("upstream unreachable")


def test_proxy_mode_is_off_without_an_upstream(tmp_path: Path, db_url: str) -> None:
    # Without proxy.upstream the chat route is the embedded decoder's (503 without a decoder), not a proxy.
    with TestClient(create_app(make_settings(tmp_path, db_url))) as client:
        response = client.post("/completion", json={"prompt": "hi"})
    assert response.status_code == 404


def test_a_bad_upstream_setting_is_refused_with_the_value(tmp_path: Path) -> None:
    from monitor.config import ConfigError

    with pytest.raises(ConfigError, match="DRAFTWATCH_PROXY_UPSTREAM='localhost:8080': expected an http"):
        make_settings(tmp_path, "sqlite:///unused.db", DRAFTWATCH_PROXY_UPSTREAM="localhost:8080")


def test_a_proxy_scope_token_guards_the_proxied_routes_apart_from_the_clients_authorization(
    tmp_path: Path, db_url: str, upstream: tuple[Upstream, str]
) -> None:
    stub, url = upstream
    proxy_token = "proxy-token-0123456789"
    tokens = f"proxy:{proxy_token},read:read-token-0123456789ab"
    body = {"model": "m", "messages": []}
    with proxy_sidecar(tmp_path, db_url, url, DRAFTWATCH_API_TOKENS=tokens) as client:
        missing = client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer upstream-key"})
        wrong = client.post(
            "/v1/chat/completions", json=body, headers={"X-Draftwatch-Token": "read-token-0123456789ab"}
        )
        passed = client.post(
            "/v1/chat/completions",
            json=body,
            headers={"X-Draftwatch-Token": proxy_token, "Authorization": "Bearer upstream-key"},
        )
    # The proxied routes answer in the OpenAI error shape, which the engine's clients parse.
    assert (missing.status_code, missing.json()["error"]["code"]) == (401, "missing_token")
    assert "X-Draftwatch-Token" in missing.json()["error"]["message"]
    assert wrong.status_code == 403 and passed.status_code == 200
    (_, seen, _) = stub.seen[-1]
    assert seen["authorization"] == "Bearer upstream-key" and "x-draftwatch-token" not in seen
    assert len(stub.seen) == 1  # the refused requests never reached the upstream


def test_a_responses_stream_is_recorded_from_its_completed_event_and_left_as_it_is(
    tmp_path: Path, db_url: str, upstream: tuple[Upstream, str]
) -> None:
    stub, url = upstream
    body = {"model": "openai/gpt-oss-20b", "input": "hi", "stream": True}
    with (
        proxy_sidecar(tmp_path, db_url, url) as client,
        client.stream("POST", "/v1/responses", json=body, headers={"X-Workload": "chat"}) as response,
    ):
        received = b"".join(response.iter_raw())
    assert received == b"".join(stub.response_events())
    assert stub.seen[-1][2] == body  # no stream_options: the Responses API has no usage to ask for
    (row,) = rows(db_url)
    assert (row["request_id"], row["prompt_tokens"], row["output_tokens"]) == ("resp_7d0c2b1e", 211, 256)
    assert (row["num_draft_tokens"], row["num_accepted_tokens"], row["finish_reason"]) == (300, 155, "length")
