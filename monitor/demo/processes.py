"""The demo's child processes: each in its own process group, stopped together however the demo ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ProcessGroup:
    """Starts ``draftwatch`` sub-commands with a shared environment and logs; :meth:`stop` ends them all."""

    def __init__(self, environ: Mapping[str, str], log_dir: Path) -> None:
        self.environ = dict(environ)
        self.log_dir = log_dir
        self.children: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, arguments: Sequence[str]) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("wb")
        command = [sys.executable, "-m", "monitor.commands", *arguments]
        child = subprocess.Popen(
            command, env=self.environ, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.children.append((name, child))
        return child

    def wait_http(self, name: str, url: str, timeout: float) -> None:
        """Wait until ``url`` answers 200, failing early (with the log's tail) if the child exits."""
        child = dict(self.children)[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child.poll() is not None:
                raise RuntimeError(f"{name} exited with status {child.returncode}:\n{self.tail(name)}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{name} did not answer {url} within {timeout:.0f} s:\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 15) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        for _, child in self.children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _, child in self.children:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        self.children.clear()
