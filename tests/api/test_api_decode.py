"""The embedded decoder behind HTTP: /v1/generate, /v1/chat/completions with the real OpenAI client, queueing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from decoder import NgramDrafter, SpeculationController, SpeculativeDecoder, load_model
from monitor.api.app import create_app
from tests.api.conftest import INGEST, READ, auth, make_settings, stored
from tests.decoder.test_controller import pass_costs
from tests.decoder.tiny import tiny_model
from tests.serving import serving

H = auth(INGEST)
PROMPT = "a b c d a b c d a b c"


def tiny_decoder() -> SpeculativeDecoder:
    target = tiny_model(seed=1, name="tiny-target")
    # A chat template for the word-level tokenizer: the messages' words, in order.
    target.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return SpeculativeDecoder(target, NgramDrafter(min_n=1, max_n=3), gamma=3)


@pytest.fixture
def live_server(tmp_path: Path, sqlite_url: str) -> Iterator[str]:
    """The app on a real uvicorn server in this process, for clients that speak real HTTP (OpenAI's)."""
    app = create_app(make_settings(tmp_path, sqlite_url), decoder=tiny_decoder())
    with serving(app, log_level="warning") as url:
        yield url


def paying_decoder() -> SpeculativeDecoder:
    """The tiny pair with costs known to pay (drafting free, a verification pass as dear as one token).

    Timed at start instead, the tiny pair's costs are a few passes' noise: on a busy machine the
    controller found speculation losing and decoded the request plain.
    """
    decoder = tiny_decoder()
    decoder.controller = SpeculationController()
    decoder.controller.calibrate(pass_costs(c=0.0, v1=1.0))
    return decoder


def test_generate_returns_text_and_record(tmp_path: Path, db_url: str) -> None:
    with TestClient(create_app(make_settings(tmp_path, db_url), decoder=paying_decoder())) as client:
        response = client.post(
            "/v1/generate", json={"prompt": PROMPT, "workload": "code", "max_new_tokens": 12, "seed": 1}, headers=H
        )
        assert response.status_code == 200, response.text
        body = response.json()
        record = body["record"]
        assert record["workload"] == "code" and record["mode"] == "speculative" and record["drafter"] == "ngram"
        assert record["output_tokens"] == 12 and body["text"]
        assert body["acceptance_rate"] == pytest.approx(record["num_accepted_tokens"] / record["num_draft_tokens"])
        client.app.state.api.recorder.flush(10)  # type: ignore[attr-defined]
        assert stored(db_url, record["request_id"])["num_accepted_tokens"] == record["num_accepted_tokens"]
        problems = [
            ({"prompt": PROMPT, "messages": [{"role": "user", "content": "a"}]}, "body"),
            ({"prompt": PROMPT, "max_new_tokens": 0}, "max_new_tokens"),
            ({"prompt": PROMPT, "workload": "a b"}, "workload"),
            ({"prompt": PROMPT, "max_new_tokens": 600}, "body"),  # beyond the tiny model's 512 positions
            ({"prompt": "   "}, "body"),
        ]
        for payload, field in problems:
            response = client.post("/v1/generate", json=payload, headers=H)
            assert response.status_code == 422, (payload, response.text)
            assert response.json()["detail"][0]["loc"][-1] == field


def test_holdout_share_and_the_metrics(tmp_path: Path, sqlite_url: str) -> None:
    settings = make_settings(tmp_path, sqlite_url, DRAFTWATCH_DECODER_HOLDOUT_SHARE="1")
    with TestClient(create_app(settings, decoder=tiny_decoder())) as client:
        body = client.post("/v1/generate", json={"prompt": PROMPT, "max_new_tokens": 4}, headers=H).json()
        assert body["record"]["mode"] == "holdout" and body["record"]["num_draft_tokens"] == 0
        assert body["record"]["holdout_reason"] == "target"  # the first of the workload's 30 per window
        client.app.state.api.recorder.flush(10)  # type: ignore[attr-defined]
        text = client.get("/metrics", headers=auth(READ)).text
        pair = 'target="tiny-target",drafter="ngram"'
        assert f'draftwatch_requests_total{{workload="default",{pair},mode="holdout"}} 1' in text
        assert f'draftwatch_requests_total{{workload="default",{pair},mode="speculative"}} 0' in text
        assert "draftwatch_decode_queue_depth 0" in text


def test_a_full_queue_answers_503_with_retry_after(tmp_path: Path, sqlite_url: str) -> None:
    settings = make_settings(tmp_path, sqlite_url, DRAFTWATCH_API_DECODE_QUEUE_SIZE="1")
    app: FastAPI = create_app(settings, decoder=tiny_decoder())
    with TestClient(app) as client:
        worker = app.state.api.worker
        worker.stop()  # no one takes jobs any more: the queue stays as full as we make it
        worker._queue.put_nowait(None)
        response = client.post("/v1/generate", json={"prompt": PROMPT}, headers=H)
        assert response.status_code == 503 and response.json()["error"] == "queue_full"
        assert int(response.headers["retry-after"]) >= 1
        response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}]}, headers=H)
        assert response.status_code == 503


def test_the_openai_client_streaming_and_not(live_server: str) -> None:
    client = openai.OpenAI(base_url=f"{live_server}/v1", api_key=INGEST, max_retries=0)
    messages: list[dict[str, str]] = [{"role": "user", "content": PROMPT}]
    completion = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0, extra_headers={"X-Workload": "code-edit"}
    )  # type: ignore[call-overload]
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage is not None and completion.usage.completion_tokens <= 10
    extension = completion.model_extra["draftwatch"]  # type: ignore[index]
    assert extension["record"]["workload"] == "code-edit"
    assert extension["record"]["request_id"] in completion.id

    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        metadata={"workload": "chat"},
    )
    pieces, finish, usage, extension = [], None, None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for streamed in chunk.choices:
            pieces.append(streamed.delta.content or "")
            finish = streamed.finish_reason or finish
        extension = (chunk.model_extra or {}).get("draftwatch", extension)
    assert "".join(pieces) == choice.message.content  # greedy: the same text streamed
    assert finish == choice.finish_reason
    assert usage is not None and usage.completion_tokens == completion.usage.completion_tokens
    assert extension is not None and extension["record"]["workload"] == "chat"

    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"{live_server}/v1", api_key="wrong-token-000000", max_retries=0
        ).chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=2,  # type: ignore[arg-type]
        )
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, n=2)  # type: ignore[arg-type]


@pytest.mark.models
def test_the_real_small_model_behind_http(tmp_path: Path, sqlite_url: str) -> None:
    decoder = SpeculativeDecoder(load_model("smollm2-135m", progress=False), NgramDrafter(), gamma=4)
    with TestClient(create_app(make_settings(tmp_path, sqlite_url), decoder=decoder)) as client:
        response = client.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "Count: 1, 2, 3, 4, 5, 6"}],
                "max_tokens": 8,
                "temperature": 0,
            },
            headers={**H, "X-Workload": "chat"},
        )
        assert response.status_code == 200, response.text
        record = response.json()["draftwatch"]["record"]
        assert record["target_model"] == "smollm2-135m" and record["output_tokens"] <= 8
