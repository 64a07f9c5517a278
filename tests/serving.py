"""Real HTTP for tests: an ASGI app on uvicorn in this process, or a ``draftwatch serve`` process of its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp

from tests.api.conftest import TOKENS

ROOT = Path(__file__).resolve().parents[1]


def wait_for(
    condition: Callable[[], object], what: str | Callable[[], object], within_s: float = 30.0, every_s: float = 0.05
) -> None:
    """Poll ``condition`` until it holds; after ``within_s`` fail, saying ``what`` (called then, if callable)."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {within_s:g} s: {what() if callable(what) else what}"
        time.sleep(every_s)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(app: ASGIApp, port: int | None = None, **options: Any) -> Iterator[str]:
    """``app`` on uvicorn (``options``: uvicorn.Config's), on ``port`` (a free one by default), its loggers
    propagating to pytest's. Yields its base URL."""
    port = port or free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, **{"log_level": "info", **options})
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def serve_process(
    tmp_path: Path, db_url: str, port: int, *options: str, flags: Sequence[str] = (), **env: str
) -> subprocess.Popen[bytes]:
    """``draftwatch [options] serve [flags]`` on ``port`` with ``env`` on top, once it answers ready; output in one
    pipe."""
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "DRAFTWATCH_DATA_DIR": str(tmp_path / "data"),
        "DRAFTWATCH_DATABASE_URL": db_url,
        "DRAFTWATCH_API_TOKENS": TOKENS,
        **env,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "monitor.commands", *options, "serve", "--port", str(port), "--no-scheduler", *flags],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise AssertionError("draftwatch serve did not become ready")
