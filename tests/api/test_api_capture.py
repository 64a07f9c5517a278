"""The prompt sample through the real app: proxied requests to a real upstream, the embedded decoder, the logs."""

from __future__ import annotations

import json
import logging
import random
import re
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from decoder.evaluation import SampleRow, read_sample
from monitor.api.app import create_app
from monitor.commands.main import main
from monitor.ingest.capture.sample import DAY_S, PromptSample, sample_line
from tests.api.conftest import INGEST, READ, auth, make_settings
from tests.api.test_api_decode import tiny_decoder
from tests.proxy.upstream import Upstream, proxy_sidecar

SAMPLE = "prompt-sample.db"


def written(client: TestClient) -> None:
    capture = client.app.state.api.capture  # type: ignore[attr-defined]
    assert capture is not None and capture.flush(10)


def export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> list[SampleRow]:
    """``draftwatch capture export`` as an operator runs it, read back by evaluate's reader."""
    monkeypatch.setenv("DRAFTWATCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("DRAFTWATCH_CONFIG", raising=False)
    out = tmp_path / "exported.jsonl"
    assert main(["capture", "export", "--out", str(out), *args]) == 0
    return read_sample(out)


def test_a_full_reservoir_keeps_exactly_its_cap_of_the_prompts_sent(
    tmp_path: Path, sqlite_url: str, upstream: tuple[Upstream, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = upstream
    sent = [f"Summarise ticket {i}: the printer on floor {i} jams" for i in range(10)]
    env = {"DRAFTWATCH_CAPTURE_SHARE": "1", "DRAFTWATCH_CAPTURE_MAX_PER_WORKLOAD": "3"}
    with proxy_sidecar(tmp_path, sqlite_url, url, **env) as client:
        for text in sent:
            body = {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0.7, "max_tokens": 64}
            assert client.post("/v1/chat/completions", json=body, headers={"X-Workload": "support"}).status_code == 200
        completion = {"model": "m", "prompt": "def fib(n):", "top_p": 0.9}
        assert client.post("/v1/completions", json=completion, headers={"X-Workload": "code"}).status_code == 200
        written(client)
        stats = client.app.state.api.capture.stats()  # type: ignore[attr-defined]
    assert (stats.considered, stats.failed) == (11, 0)
    rows = export(tmp_path, monkeypatch, "--workload", "support")
    assert len(rows) == 3 and len({json.dumps(row.prompt) for row in rows}) == 3
    for row in rows:
        assert isinstance(row.prompt, list) and row.prompt[0]["content"] in sent
        settings = (row.workload, row.chat, row.temperature, row.top_p, row.max_new_tokens)
        assert settings == ("support", True, 0.7, 1.0, 64)
    # A completion's prompt is raw text: evaluate must not wrap it in the chat template.
    completions = export(tmp_path, monkeypatch, "--workload", "code")
    # No temperature in the body: the upstream sampled at its default of 1, and so is the replay.
    assert completions == [SampleRow("code", "def fib(n):", chat=False, temperature=1.0, top_p=0.9)]
    status = {w.workload: (w.kept, w.seen) for w in PromptSample.open(tmp_path / "data" / SAMPLE).status()}
    assert status == {"code": (1, 1), "support": (3, 10)}


def test_share_zero_keeps_nothing_and_makes_no_file(
    tmp_path: Path, sqlite_url: str, upstream: tuple[Upstream, str]
) -> None:
    _, url = upstream
    with proxy_sidecar(tmp_path, sqlite_url, url) as client:
        for _ in range(5):
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert client.app.state.api.capture is None  # type: ignore[attr-defined]
        metrics = client.get("/metrics", headers=auth(READ))
        assert metrics.status_code == 200 and "draftwatch_capture" not in metrics.text
    assert not (tmp_path / "data" / SAMPLE).exists()


def test_what_is_not_plain_text_or_was_refused_is_not_kept(
    tmp_path: Path, sqlite_url: str, upstream: tuple[Upstream, str]
) -> None:
    stub, url = upstream
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    with proxy_sidecar(tmp_path, sqlite_url, url, DRAFTWATCH_CAPTURE_SHARE="1") as client:
        client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": image}]})
        client.post("/v1/completions", json={"model": "m", "prompt": [1, 2, 3]})
        client.post("/v1/chat/completions", json={"model": "m", "messages": [], "temperature": 50})
        stub.fail_with = 400
        client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        written(client)
        stats = client.app.state.api.capture.stats()  # type: ignore[attr-defined]
    assert (stats.considered, stats.unusable, stats.kept) == (3, 3, 0)  # the refused request was never considered


def test_the_embedded_decoders_requests_are_kept_as_the_decoder_ran_them(
    tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(tmp_path, sqlite_url, DRAFTWATCH_CAPTURE_SHARE="1")
    with TestClient(create_app(settings, decoder=tiny_decoder())) as client:
        generated = {"prompt": "a b c d a b", "workload": "code", "max_new_tokens": 4, "temperature": 0.5}
        assert client.post("/v1/generate", json=generated, headers=auth(INGEST)).status_code == 200
        chat = {"messages": [{"role": "user", "content": "a b c a b"}], "max_tokens": 3, "top_p": 0.8}
        headers = {**auth(INGEST), "X-Workload": "chat"}
        assert client.post("/v1/chat/completions", json=chat, headers=headers).status_code == 200
        written(client)
    assert export(tmp_path, monkeypatch) == [
        SampleRow("chat", [{"role": "user", "content": "a b c a b"}], temperature=1.0, top_p=0.8, max_new_tokens=3),
        SampleRow("code", "a b c d a b", chat=False, temperature=0.5, max_new_tokens=4),
    ]


def test_a_write_removes_prompts_past_their_retention(
    tmp_path: Path, sqlite_url: str, upstream: tuple[Upstream, str]
) -> None:
    _, url = upstream
    sample = PromptSample.open(tmp_path / "data" / SAMPLE)
    old = sample_line(SampleRow("support", "eight days old"))
    assert old is not None
    sample.keep([("support", old, time.time() - 8 * DAY_S)], 200, random.Random(0))
    sample.close()
    with proxy_sidecar(tmp_path, sqlite_url, url, DRAFTWATCH_CAPTURE_SHARE="1") as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "today"}]}
        client.post("/v1/chat/completions", json=body, headers={"X-Workload": "support"})
        written(client)
        kept = PromptSample.open(tmp_path / "data" / SAMPLE).lines()  # read as stored: no command's pruning
    assert [json.loads(line)["messages"][0]["content"] for line in kept] == ["today"]


def test_no_prompt_reaches_the_logs_even_when_the_file_cannot_be_written(
    tmp_path: Path, sqlite_url: str, upstream: tuple[Upstream, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, url = upstream
    secret = "my card number is 4111 1111 1111 1111"
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    env = {"DRAFTWATCH_CAPTURE_SHARE": "1", "DRAFTWATCH_CAPTURE_PATH": str(blocked / SAMPLE)}
    with caplog.at_level(logging.DEBUG), proxy_sidecar(tmp_path, sqlite_url, url, **env) as client:
        for content in (secret, [{"type": "text", "text": secret}]):
            body = {"model": "m", "messages": [{"role": "user", "content": content}]}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        written(client)
        metrics = client.get("/metrics", headers=auth(READ)).text
    assert "draftwatch_capture_failed_total 2\n" in metrics
    # The failure is logged (the two prompts may fail in one write or in two) ...
    assert re.search(r"prompt sample: [12] prompts not written", caplog.text)
    assert "4111" not in caplog.text and "card number" not in caplog.text  # ... without the prompt
    for record in caplog.records:
        assert "4111" not in json.dumps([str(a) for a in (record.args or ())])
