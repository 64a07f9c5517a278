"""Proxy mode in front of a real llama-server, driven by the real openai client, streamed and not.

The sidecar runs under uvicorn on a loopback port with ``--upstream`` pointing at llama-server
(smollm2-135m as its own draft, temperature 0, so both sides decode the same greedy text). What the
client reads through the proxy must equal what llama-server answers directly, and the stored
record's drafted and accepted counts must equal llama-server's own ``timings``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from decoder.models.fetch import fetch_preset
from monitor.api.app import create_app
from tests.api.conftest import make_settings, stored
from tests.proxy.test_engine_watch import wait_read
from tests.proxy.test_proxy import rows
from tests.serving import serving
from tests.stacks.llama_server import BASE_ARGS, LlamaServer, draft_args, llama_server, require_binary

pytestmark = pytest.mark.models
MESSAGES: Any = [{"role": "user", "content": "Name three primary colours, one per line."}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[LlamaServer]:
    model = fetch_preset("smollm2-135m", progress=False)
    with llama_server(model, *BASE_ARGS, *draft_args(model), binary=require_binary()) as server:
        yield server


def serve(tmp_path: Path, db_url: str, upstream_url: str) -> Iterator[tuple[str, Any]]:
    settings = make_settings(
        tmp_path, db_url, DRAFTWATCH_PROXY_UPSTREAM=upstream_url, DRAFTWATCH_API_TOKENS="",
        DRAFTWATCH_PROXY_ENGINE_WATCH_S="0.5",
    )  # fmt: skip
    app = create_app(settings)
    with serving(app) as url:
        yield url, app


@pytest.fixture
def sidecar(tmp_path: Path, db_url: str, upstream: LlamaServer) -> Iterator[tuple[str, Any]]:
    yield from serve(tmp_path, db_url, upstream.url)


def flush(app: Any) -> None:
    assert app.state.api.recorder.flush(10)


def test_a_chat_through_the_proxy_is_what_llama_server_answers(
    sidecar: tuple[str, Any], upstream: LlamaServer, db_url: str
) -> None:
    url, app = sidecar
    direct = openai.OpenAI(base_url=f"{upstream.url}/v1", api_key="none")
    proxied = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    expected = direct.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=24, temperature=0)
    # The engine watch's read after a slot has served: llama.cpp's /slots names the drafter from then on.
    wait_read(app, lambda engine: engine.drafter is not None)
    got = proxied.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=24, temperature=0, extra_headers={"X-Workload": "code"}
    )
    assert got.choices[0].message.content == expected.choices[0].message.content
    timings = (got.model_extra or {})["timings"]
    flush(app)
    row = stored(db_url, got.id)
    assert (row["workload"], row["mode"], row["source"]) == ("code", "speculative", "proxy:llamacpp")
    assert (row["num_draft_tokens"], row["num_accepted_tokens"]) == (timings["draft_n"], timings["draft_n_accepted"])
    assert timings["draft_n"] > 0
    assert (row["prompt_tokens"], row["output_tokens"]) == (got.usage.prompt_tokens, got.usage.completion_tokens)  # type: ignore[union-attr]
    # What llama.cpp says of itself: its build (/props), no process start (first sight), no KV-cache gauge.
    build = httpx.get(f"{upstream.url}/props", timeout=30).json()["build_info"]
    assert (row["engine_version"], row["uptime_from"], row["kv_cache_use"]) == (build, "first_sight", None)
    assert build.startswith("b") and 0 <= row["replica_uptime_s"] < 120
    # Its drafter, as /slots names it (draft_args: a draft model).
    assert row["draft_version"] == "draft-simple", row["draft_version"]


def test_a_streamed_chat_through_the_proxy(sidecar: tuple[str, Any], upstream: LlamaServer, db_url: str) -> None:
    url, app = sidecar
    direct = openai.OpenAI(base_url=f"{upstream.url}/v1", api_key="none")
    proxied = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    arguments: Any = {"model": "smollm2-135m", "messages": MESSAGES, "max_tokens": 24, "temperature": 0}
    reference = list(direct.chat.completions.create(**arguments, stream=True, stream_options={"include_usage": True}))
    chunks = list(proxied.chat.completions.create(**arguments, stream=True, extra_headers={"X-Workload": "chat"}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(c.choices[0].delta.content or "" for c in reference if c.choices)
    # The client did not ask for usage: the chunk the proxy asked for on its behalf is not passed on.
    assert all(c.choices for c in chunks) and not any(c.usage for c in chunks)
    timings = (reference[-1].model_extra or {})["timings"]
    flush(app)
    (row,) = rows(db_url)
    assert (row["workload"], row["finish_reason"]) == ("chat", "length")
    assert (row["num_draft_tokens"], row["num_accepted_tokens"]) == (timings["draft_n"], timings["draft_n_accepted"])
    assert row["output_tokens"] == reference[-1].usage.completion_tokens  # type: ignore[union-attr]
    assert 0 < row["ttft_ms"] < row["latency_ms"]


def test_llama_server_killed_mid_stream_gives_a_clean_error_and_an_error_record(tmp_path: Path, db_url: str) -> None:
    model = fetch_preset("smollm2-135m", progress=False)
    with llama_server(model, *BASE_ARGS, *draft_args(model), binary=require_binary()) as doomed:
        for url, app in serve(tmp_path, db_url, doomed.url):
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
            stream = client.chat.completions.create(
                model="smollm2-135m", messages=MESSAGES, max_tokens=400, temperature=0, stream=True
            )
            with pytest.raises((openai.APIError, httpx.HTTPError)):
                for number, _chunk in enumerate(stream):
                    if number == 2:
                        doomed.process.kill()
            flush(app)
            (row,) = rows(db_url)
            assert row["finish_reason"] == "error" and row["error"].startswith("upstream stream cut")
            after = httpx.post(f"{url}/v1/chat/completions", json={"messages": MESSAGES}, timeout=10)
            assert after.status_code == 502 and after.json()["error"]["type"] == "upstream_unavailable"
