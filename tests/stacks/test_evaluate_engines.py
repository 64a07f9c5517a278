"""``draftwatch evaluate --server`` against vLLM and SGLang: stand-in servers answering in the fixtures' shapes.

vLLM answers as tests/fixtures/stacks/vllm/chat-summary.json (vllm-project/vllm 02cf515f:
``metrics.speculative_decoding`` with ``--per-request-spec-decode-metrics summary``, and its timing
fields); SGLang as tests/fixtures/stacks/sglang/chat-meta-info.json and
completions-spec-tokens-details.json (sgl-project/sglang 004c82e0 and PR #33518), without
``--enable-metrics``, so that it reports no timings and evaluate times a streamed request itself.
The servers are real HTTP on loopback; each remembers what it was sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from monitor.commands.evaluate.servers import ServerVerdict, speedup_interval
from monitor.commands.main import main
from tests.proxy.upstream import fixture

VLLM = fixture("vllm", "chat-summary")["response"]
SGLANG_META = fixture("sglang", "chat-meta-info")["response"]["choices"][0]["meta_info"]
SGLANG_DETAILS = fixture("sglang", "completions-spec-tokens-details")["response"]["sglext"]["spec_tokens_details"]


class Engine:
    """One stand-in server: ``kind`` vllm or sglang, drafting or plain, ``ms`` per generated token."""

    def __init__(self, kind: str, *, drafting: bool, ms: float) -> None:
        self.kind, self.drafting, self.ms = kind, drafting, ms
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        chat = path == "/v1/chat/completions"
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        choice |= {"message": {"role": "assistant", "content": "text"}} if chat else {"text": "text"}
        if self.kind == "vllm":
            metrics: dict[str, Any] = {"time_to_first_token_ms": 50.0, "generation_time_ms": self.ms * 53}
            if self.drafting:
                metrics["speculative_decoding"] = VLLM["metrics"]["speculative_decoding"]
            return {"id": "v1", "model": VLLM["model"], "choices": [choice], "usage": VLLM["usage"], "metrics": metrics}
        usage = {"prompt_tokens": 20, "completion_tokens": 30, "total_tokens": 50}
        meta = {k: v for k, v in SGLANG_META.items() if not k.endswith(("_ts", "_time")) and k != "e2e_latency"}
        if not self.drafting:
            meta = {k: v for k, v in meta.items() if not k.startswith("spec_")}
        if chat and body.get("return_meta_info"):
            choice["meta_info"] = meta
        answer = {"id": "s1", "model": "m", "choices": [choice], "usage": usage}
        if self.drafting and body.get("return_spec_tokens_details"):
            answer["sglext"] = {"spec_tokens_details": SGLANG_DETAILS}
        return answer

    def events(self, path: str, body: dict[str, Any]) -> Iterator[bytes]:
        chat = path == "/v1/chat/completions"
        for piece in ("a", "b", "c", "d"):
            time.sleep(self.ms * 29 / 3 / 1000)  # 30 tokens in 4 text events: 29 tokens' time between first and last
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            yield f"data: {json.dumps({'id': 's1', 'choices': [choice], 'usage': None})}\n\n".encode()
        usage = {"prompt_tokens": 20, "completion_tokens": 30, "total_tokens": 50}
        yield f"data: {json.dumps({'id': 's1', 'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(engine: Engine) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                engine.seen.append((self.path, body))
                if body.get("stream"):
                    if engine.kind == "sglang" and body.get("return_meta_info"):
                        self.send_response(400)  # serving_chat.py refuses it on a stream
                        self.end_headers()
                        return
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for event in engine.events(self.path, body):
                        self.wfile.write(event)
                        self.wfile.flush()
                    return
                content = json.dumps(engine.answer(self.path, body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def sample(tmp_path: Path) -> Path:
    path = tmp_path / "sample.jsonl"
    rows = [{"workload": "chat", "prompt": f"say {n}"} for n in range(3)]
    rows += [{"workload": "copy", "prompt": f"copy {n}", "chat": False} for n in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["evaluate", *argv])
    return code, capsys.readouterr().out


def test_a_vllm_candidate_is_read_from_its_metrics_with_a_verdict(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    candidate, plain = Engine("vllm", drafting=True, ms=5.0), Engine("vllm", drafting=False, ms=10.0)
    url, plain_url = serve(candidate), serve(plain)
    code, out = run(capsys, "--server", url, "--plain-server", plain_url, "--prompts", str(sample(tmp_path)), "--json")
    assert code == 0
    reports = json.loads(out)
    assert [r["workload"] for r in reports] == ["chat", "copy"]
    spec = VLLM["metrics"]["speculative_decoding"]
    for report in reports:
        (result,) = report["candidates"]
        # Three prompts a workload, each answered with the fixture's counts.
        drafted, accepted, steps = spec["num_draft_tokens"], spec["num_accepted_draft_tokens"], spec["num_spec_steps"]
        assert (result["drafted"], result["accepted"]) == (3 * drafted, 3 * accepted)
        assert result["mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
        # vLLM's own generation time: 53 tokens after the first at 5 ms, against 10 ms plain.
        assert result["ms_per_token"] == pytest.approx(5.0) and result["measured_speedup"] == pytest.approx(2.0)
        assert result["speedup_interval"] == pytest.approx([2.0, 2.0]) and result["verdict"] == "pays"
    # Nothing but the request: no second, streamed one where the engine reports its timings.
    assert all(not body["stream"] for _, body in candidate.seen + plain.seen) and len(candidate.seen) == 6


def test_an_sglang_candidate_is_asked_for_its_counts_and_timed_on_a_stream(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    candidate, plain = Engine("sglang", drafting=True, ms=1.0), Engine("sglang", drafting=False, ms=8.0)
    url, plain_url = serve(candidate), serve(plain)
    code, out = run(capsys, "--server", url, "--plain-server", plain_url, "--prompts", str(sample(tmp_path)))
    assert code == 0
    for workload in ("chat", "copy"):
        # 3 prompts x (30 drafted, 19 accepted) each, through meta_info (chat) or sglext (completions).
        line = next(x for x in out.splitlines() if x.startswith(workload) and "server:" in x and "speedup" not in x)
        assert "0.63 (" in line, line
        assert f"{workload:<12} server:{url}: speedup " in out
    verdicts = [x for x in out.splitlines() if ": speedup " in x]
    assert len(verdicts) == 2 and all(x.endswith(": pays") for x in verdicts), out
    chat = [body for path, body in candidate.seen if path == "/v1/chat/completions"]
    whole = [body for body in chat if not body["stream"]]
    streamed = [body for body in chat if body["stream"]]
    assert all(b["return_meta_info"] and b["return_spec_tokens_details"] for b in whole) and len(whole) == 3
    # The stream that times the decode does not ask for meta_info, which SGLang refuses on a stream.
    assert len(streamed) == 3 and not any("return_meta_info" in b for b in streamed)
    completions = [body for path, body in candidate.seen if path == "/v1/completions" and not body["stream"]]
    assert all(b["return_spec_tokens_details"] and "return_meta_info" not in b for b in completions)


def test_a_plain_openai_server_as_a_candidate_is_refused_with_what_each_engine_needs(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = serve(Engine("vllm", drafting=False, ms=5.0))
    assert main(["evaluate", "--server", url, "--prompts", str(sample(tmp_path))]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {url}/v1/chat/completions gave no speculative counts (metrics.speculative_decoding")
    assert "--per-request-spec-decode-metrics summary" in err and "--speculative-algorithm" in err


def test_the_verdict_follows_the_interval() -> None:
    assert ServerVerdict("w", "d", 1.5, (1.2, 1.8)).word == "pays"
    assert ServerVerdict("w", "d", 0.7, (0.6, 0.9)).word == "net_loss"
    assert ServerVerdict("w", "d", 1.0, (0.9, 1.1)).word == "inconclusive"
    assert (
        ServerVerdict("w", "d", None, None).word is None and "no verdict" in ServerVerdict("w", "d", None, None).line()
    )
    assert speedup_interval([], []) is None
