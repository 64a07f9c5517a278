"""A real llama-server (scripts/ensure-llama-server.sh builds it) and what it reports about speculation.

smollm2-135m is both target and draft, at temperature 0 and at most 32 tokens, so each test takes a
second or two; each server runs for the whole module. The timings fields are llama.cpp's
``server_slot_stats::to_json`` (tools/server/server-common.cpp): ``draft_n`` and
``draft_n_accepted`` appear only when something was drafted, ``prompt_n`` counts the prompt tokens
evaluated, ``cache_n`` those taken from the slot's cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from decoder.models.fetch import fetch_preset
from tests.stacks.llama_server import (
    BASE_ARGS,
    CACHED,
    CHAT,
    CHAT_STREAMED,
    COMPLETION,
    NGRAM,
    NGRAM_ARGS,
    Json,
    LlamaServer,
    draft_args,
    final_chunk,
    llama_server,
    post,
    require_binary,
    stream,
)

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def binary() -> Path:
    return require_binary()


@pytest.fixture(scope="module")
def model(binary: Path) -> Path:
    return fetch_preset("smollm2-135m", progress=False)


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120.0) as http:
        yield http


@pytest.fixture(scope="module")
def draft_server(binary: Path, model: Path) -> Iterator[LlamaServer]:
    with llama_server(model, *BASE_ARGS, *draft_args(model), binary=binary) as server:
        yield server


@pytest.fixture(scope="module")
def ngram_server(binary: Path, model: Path) -> Iterator[LlamaServer]:
    with llama_server(model, *BASE_ARGS, *NGRAM_ARGS, binary=binary) as server:
        yield server


@pytest.fixture(scope="module")
def plain_server(binary: Path, model: Path) -> Iterator[LlamaServer]:
    with llama_server(model, *BASE_ARGS, binary=binary) as server:
        yield server


def assert_drafted_by_itself(timings: dict[str, Any]) -> None:
    assert timings["prompt_n"] > 0 and timings["predicted_n"] > 0
    assert timings["draft_n"] > 0
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    # The draft is the target itself at temperature 0: both take the same argmax, so nearly every
    # drafted token is accepted. 0.5 leaves room for float differences between the draft's one-token
    # passes and the target's batched verification, and still fails if acceptance were not counted.
    assert timings["draft_n_accepted"] / timings["draft_n"] > 0.5


def test_completion_reports_drafted_and_accepted(draft_server: LlamaServer, client: httpx.Client) -> None:
    response = post(client, draft_server, "/completion", COMPLETION)
    timings = response["timings"]
    assert_drafted_by_itself(timings)
    assert timings["predicted_n"] == response["tokens_predicted"] <= COMPLETION["n_predict"]
    # tokens_evaluated is the whole prompt; prompt_n leaves out what came from the cache.
    assert timings["prompt_n"] + timings["cache_n"] == response["tokens_evaluated"]


def test_chat_reports_drafted_and_accepted(draft_server: LlamaServer, client: httpx.Client) -> None:
    response = post(client, draft_server, "/v1/chat/completions", CHAT)
    timings, usage = response["timings"], response["usage"]
    assert_drafted_by_itself(timings)
    assert usage["completion_tokens"] == timings["predicted_n"] <= CHAT["max_tokens"]
    assert usage["prompt_tokens"] == timings["prompt_n"] + timings["cache_n"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == timings["cache_n"]
    assert response["choices"][0]["message"]["content"]


def test_streamed_chat_carries_timings_and_usage_in_its_final_chunk(
    draft_server: LlamaServer, client: httpx.Client
) -> None:
    chunks = stream(client, draft_server, "/v1/chat/completions", CHAT_STREAMED)
    final = final_chunk(chunks)
    # With include_usage the last event is the usage chunk, with no choices (as OpenAI sends it).
    assert final["choices"] == []
    timings, usage = final["timings"], final["usage"]
    assert_drafted_by_itself(timings)
    assert usage["completion_tokens"] == timings["predicted_n"]
    assert usage["prompt_tokens"] == timings["prompt_n"] + timings["cache_n"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text


def test_ngram_speculation_drafts_from_the_prompt(ngram_server: LlamaServer, client: httpx.Client) -> None:
    response = post(client, ngram_server, "/completion", NGRAM)
    timings = response["timings"]
    # The model copies a list that is in the prompt, so the last 3-gram recurs and its successors
    # are drafted; copying them is what the model does anyway, so some are accepted.
    assert timings["draft_n"] > 0
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]


def test_a_repeated_prompt_is_served_from_the_cache(draft_server: LlamaServer, client: httpx.Client) -> None:
    first = post(client, draft_server, "/completion", CACHED)
    second = post(client, draft_server, "/completion", CACHED)
    one, two = first["timings"], second["timings"]
    # The same prompt on the same (single) slot: the second evaluates only what the cache lacks, so
    # prompt_n alone undercounts the prompt; prompt_n + cache_n is the prompt both times.
    assert two["cache_n"] > one["cache_n"] and two["cache_n"] > 0
    assert two["prompt_n"] < one["prompt_n"]
    assert one["prompt_n"] + one["cache_n"] == two["prompt_n"] + two["cache_n"] == second["tokens_evaluated"]


def test_a_draft_model_without_a_spec_type_drafts_nothing(binary: Path, model: Path, client: httpx.Client) -> None:
    # This build loads the -md model but speculates only with --spec-type draft-simple (the default
    # type is none, common/common.h): a server configured with -md alone reports no draft fields.
    with llama_server(model, *BASE_ARGS, "--spec-draft-model", str(model), binary=binary) as server:
        timings = post(client, server, "/completion", COMPLETION)["timings"]
    assert timings["predicted_n"] > 0
    assert "draft_n" not in timings and "draft_n_accepted" not in timings


def test_without_speculation_timings_carry_no_draft_fields(plain_server: LlamaServer, client: httpx.Client) -> None:
    response: Json = post(client, plain_server, "/completion", COMPLETION)
    timings = response["timings"]
    assert timings["predicted_n"] > 0 and timings["prompt_n"] > 0
    assert "draft_n" not in timings and "draft_n_accepted" not in timings
