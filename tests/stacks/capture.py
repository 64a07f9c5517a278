"""Capture real llama-server responses as fixtures for the llama.cpp adapter's tests.

``.venv/bin/python -m tests.stacks.capture`` starts the llama-server that
``scripts/ensure-llama-server.sh`` built (without a draft, with smollm2-135m as its own draft, with
n-gram speculation), sends the requests tests/stacks/test_llama_server.py sends, and writes each
response to ``tests/fixtures/stacks/llamacpp/real-b<build>-<case>.json`` with the counts an adapter
should read from it. Nothing is edited: ``response`` is what the server returned (for a stream, its
final chunk, the one with ``timings`` and ``usage``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx

from decoder.models.fetch import fetch_preset
from tests.stacks.llama_server import (
    BASE_ARGS,
    CACHED,
    CHAT,
    CHAT_STREAMED,
    COMPLETION,
    NGRAM,
    NGRAM_ARGS,
    ROOT,
    Json,
    binary_path,
    build_number,
    draft_args,
    expected_binary,
    final_chunk,
    llama_server,
    post,
    stream,
    version,
)

FIXTURES = ROOT / "tests" / "fixtures" / "stacks" / "llamacpp"


def expected(response: Json) -> Json:
    """The counts an adapter should report: the whole prompt, the output, drafted and accepted."""
    timings = response["timings"]
    return {
        "prompt_tokens": timings["prompt_n"] + timings["cache_n"],
        "output_tokens": timings["predicted_n"],
        "drafted": timings.get("draft_n", 0),
        "accepted": timings.get("draft_n_accepted", 0),
    }


def capture(binary: Path, out: Path) -> list[Path]:
    """Run every case against fresh servers and write one fixture per case; returns the files."""
    model = fetch_preset("smollm2-135m", progress=False)
    build, full_version = build_number(binary), version(binary)
    cases: list[tuple[str, str, bool, Json]] = []
    posted: dict[str, Json] = {}
    with httpx.Client(timeout=120.0) as client:
        with llama_server(model, *BASE_ARGS, binary=binary) as server:
            cases.append(("completion-nodraft", "/completion", False, post(client, server, "/completion", COMPLETION)))
        with llama_server(model, *BASE_ARGS, *draft_args(model), binary=binary) as server:
            cases.append(("completion-draft", "/completion", False, post(client, server, "/completion", COMPLETION)))
            chat = post(client, server, "/v1/chat/completions", CHAT)
            cases.append(("chat-draft", "/v1/chat/completions", False, chat))
            chunks = stream(client, server, "/v1/chat/completions", CHAT_STREAMED)
            cases.append(("chat-draft-streamed-final", "/v1/chat/completions", True, final_chunk(chunks)))
            # The usage chunk has no choices: a log shipper posts the finish reason of the chunk that carried it.
            reasons = [
                c["finish_reason"] for chunk in chunks for c in chunk.get("choices", []) if c.get("finish_reason")
            ]
            posted["chat-draft-streamed-final"] = {"finish_reason": reasons[-1]}
            post(client, server, "/completion", CACHED)
            cases.append(("completion-cached", "/completion", False, post(client, server, "/completion", CACHED)))
        with llama_server(model, *BASE_ARGS, *NGRAM_ARGS, binary=binary) as server:
            cases.append(("completion-ngram", "/completion", False, post(client, server, "/completion", NGRAM)))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for case, endpoint, streamed, response in cases:
        fixture = {
            "stack": "llamacpp",
            "version": full_version,
            "source": f"captured from llama-server {full_version} by tests/stacks/capture.py",
            "endpoint": endpoint,
            "streamed": streamed,
            "response": response,
            "expected": expected(response),
            **({"posted": posted[case]} if case in posted else {}),
        }
        path = out / f"real-b{build}-{case}.json"
        path.write_text(json.dumps(fixture, indent=2, ensure_ascii=False) + "\n")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=FIXTURES, help=f"where to write (default: {FIXTURES})")
    args = parser.parse_args(argv)
    binary = binary_path()
    if binary is None:
        print(f"llama-server is not built at {expected_binary()}: run `bash scripts/ensure-llama-server.sh`")
        return 2
    for path in capture(binary, args.out):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
