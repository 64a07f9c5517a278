"""``draftwatch evaluate --server``: a real llama-server as a candidate, read through the sidecar's llama.cpp parser.

The candidate is smollm2-135m drafting by n-gram lookup (so that some drafts are rejected and a
swapped or misread count shows), the plain baseline the same model without speculation. Every
answer the servers give is captured on the client, so that the report's figures are checked
against the servers' own timings, summed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from decoder.evaluation import SampleRow
from decoder.models.fetch import fetch_preset
from decoder.speculation.controller import wilson_interval
from monitor.commands.evaluate.servers import measure_servers
from monitor.commands.main import main
from tests.stacks.llama_server import (
    BASE_ARGS,
    NGRAM,
    NGRAM_ARGS,
    LlamaServer,
    draft_args,
    free_port,
    llama_server,
    post,
    require_binary,
)

COPY = NGRAM["prompt"]
ROWS = [
    SampleRow("copy", COPY, chat=False),
    SampleRow("copy", "Repeat exactly, twice: red green blue, red green blue,", chat=False),
    SampleRow("chat", "Name three primary colours, one per line."),
    SampleRow("chat", [{"role": "user", "content": "Count from one to ten in words."}], temperature=0.7, top_p=0.9),
]


@pytest.fixture(scope="module")
def model() -> Path:
    require_binary()
    return fetch_preset("smollm2-135m", progress=False)


@pytest.fixture(scope="module")
def candidate(model: Path) -> Iterator[LlamaServer]:
    with llama_server(model, *BASE_ARGS, *NGRAM_ARGS) as server:
        yield server


@pytest.fixture(scope="module")
def plain(model: Path) -> Iterator[LlamaServer]:
    with llama_server(model, *BASE_ARGS) as server:
        yield server


class Captured:
    """Every request a client sent and the JSON answer it got, by server."""

    def __init__(self) -> None:
        self.exchanges: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = []  # (base URL, path, body, answer)

    def hook(self, response: httpx.Response) -> None:
        response.read()
        request = response.request
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        self.exchanges.append((base, request.url.path, json.loads(request.content), response.json()))

    def answers(self, server: LlamaServer) -> list[dict[str, Any]]:
        return [answer for base, _, _, answer in self.exchanges if base == server.url]


@pytest.mark.models
def test_a_server_candidates_figures_are_the_servers_own_timings_summed(
    candidate: LlamaServer, plain: LlamaServer
) -> None:
    captured = Captured()
    measured = {"copy": ROWS[:2], "chat": ROWS[2:]}
    with httpx.Client(timeout=300, event_hooks={"response": [captured.hook]}) as client:
        reports, _ = measure_servers(
            [candidate.url], measured, plain_server=plain.url, max_new_tokens=24, client=client
        )
    assert [r.workload for r in reports] == ["copy", "chat"]
    # Prompt by prompt: the plain server, then the candidate; a chat through the chat endpoint, with its sampling.
    bases = [base for base, *_ in captured.exchanges]
    assert bases == [plain.url, candidate.url] * 4
    paths = [path for _, path, *_ in captured.exchanges[::2]]
    assert paths == ["/v1/completions"] * 2 + ["/v1/chat/completions"] * 2
    body = captured.exchanges[-1][2]
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.7, 0.9, 24)
    assert body["messages"] == [{"role": "user", "content": "Count from one to ten in words."}]
    assert captured.exchanges[0][2]["temperature"] == 0.0 and captured.exchanges[0][2]["prompt"] == COPY

    answers, baseline = captured.answers(candidate), captured.answers(plain)
    for number, report in enumerate(reports):
        mine, theirs = answers[2 * number : 2 * number + 2], baseline[2 * number : 2 * number + 2]
        (result,) = report.candidates
        assert (result.drafter, result.server, result.predicted_speedup, result.gamma) == (
            f"server:{candidate.url}", candidate.url, None, None)  # fmt: skip
        drafted = sum(a["timings"].get("draft_n", 0) for a in mine)
        accepted = sum(a["timings"].get("draft_n_accepted", 0) for a in mine)
        assert (result.drafted, result.accepted) == (drafted, accepted)
        decoded = sum(a["usage"]["completion_tokens"] - 1 for a in mine)
        assert result.ms_per_token == pytest.approx(sum(a["timings"]["predicted_ms"] for a in mine) / decoded)
        plain_ms = sum(a["timings"]["predicted_ms"] for a in theirs) / sum(
            a["usage"]["completion_tokens"] - 1 for a in theirs)  # fmt: skip
        assert report.plain_server_ms_per_token == pytest.approx(plain_ms)
        assert result.measured_speedup == pytest.approx(plain_ms / result.ms_per_token)
        assert (report.recommendation, report.plain_ms_per_token, report.held_out_prompts) == (None, None, 2)
        if drafted:
            assert result.acceptance == accepted / drafted
            assert result.acceptance_interval == wilson_interval(accepted / drafted, drafted)
            # Each verification pass emits one token of the target's own after its accepted drafts.
            assert result.mean_acceptance_length == pytest.approx(1 + accepted / (decoded - accepted))
    results = [report.candidates[0] for report in reports]
    assert results[0].accepted > 0, "n-gram lookup on a copy task drafts, and its drafts hold"
    assert any(r.drafted > r.accepted for r in results), "not every draft holds: a swapped count would show"


@pytest.mark.models
def test_the_cli_reports_a_server_beside_an_embedded_candidate(
    candidate: LlamaServer, plain: LlamaServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = tmp_path / "sample.jsonl"
    prompts = [COPY, "Copy exactly: 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4,"] * 2
    sample.write_text("".join(json.dumps({"workload": "copy", "prompt": p, "chat": False}) + "\n" for p in prompts))
    argv = ["evaluate", "--target", "smollm2-135m", "--drafter", "ngram", "--server", f"{candidate.url}/v1/",
            "--plain-server", plain.url, "--prompts", str(sample), "--max-new-tokens", "8", "--json"]  # fmt: skip
    assert main(argv) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert (report["learn_prompts"], report["held_out_prompts"]) == (2, 2)
    local, remote = report["candidates"]
    assert local["drafter"] == "ngram" and local["server"] is None and local["predicted_speedup"] is not None
    assert remote["server"] == candidate.url and remote["predicted_speedup"] is None and remote["drafted"] > 0
    assert report["plain_ms_per_token"] > 0 and report["plain_server_ms_per_token"] > 0
    # The recommendation is the embedded controller's, among its own candidates.
    assert report["recommendation"] in {"plain", "ngram"} and report["measured_best"] in {"plain", "ngram"}


@pytest.mark.models
def test_a_plain_server_that_drafts_is_refused(candidate: LlamaServer, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["evaluate", "--server", candidate.url, "--plain-server", candidate.url, "--builtin",
            "--max-new-tokens", "8"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"error: {candidate.url} drafted " in err and "start it without a draft" in err


@pytest.mark.models
def test_llama_server_11434_has_no_per_request_switch_for_speculation(model: Path) -> None:
    """Why a remote speedup needs --plain-server: the request below still drafts. If it stops, use it instead."""
    with llama_server(model, *BASE_ARGS, *draft_args(model)) as server, httpx.Client(timeout=300) as client:
        off = {**NGRAM, "speculative.n_max": 0, "speculative.n_min": 0, "speculative.types": "none"}
        assert post(client, server, "/completion", off)["timings"]["draft_n"] > 0


def test_an_unreachable_server_is_named_with_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["evaluate", "--server", url, "--builtin"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach {url} (ConnectError") and "start the server there" in err
    assert "Traceback" not in err


class OpenAIOnly(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that is not llama.cpp: usage, no timings."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"id": "x", "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 5, "completion_tokens": 1}}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the test's output is the command's


@pytest.fixture
def openai_only() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), OpenAIOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_reports_no_counts_is_refused(openai_only: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--server", openai_only, "--builtin"]) == 1
    err = capsys.readouterr().err
    # Usage alone reads as vLLM without its per-request metrics (tests/stacks/test_evaluate_engines.py: the others).
    assert err.startswith(f"error: {openai_only}/v1/chat/completions gave no speculative counts (metrics.")
    assert "takes a llama.cpp llama-server" in err and "Traceback" not in err


def test_a_plain_server_without_a_candidate_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "--plain-server", "http://127.0.0.1:1", "--builtin"]) == 2
    assert "name at least one --server URL" in capsys.readouterr().err
