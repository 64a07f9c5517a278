"""What the alert, delivery and scheduler tests share: their settings, drift results, a clock, and a real
HTTP receiver (the ``receiver`` fixture of tests/conftest.py serves one per test)."""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from monitor.config import Settings
from monitor.drift.result import DriftResult

SECRET = "whsec_" + base64.b64encode(b"draftwatch-test-secret-key-0123").decode()
# Evaluations use times from here on; two hours back, so the outbox rows are due and young when delivered.
T0 = (datetime.now(UTC) - timedelta(hours=2)).replace(second=0, microsecond=0)


def make_settings(tmp_path: Path, db_url: str, webhooks: list[dict[str, Any]] | None = None, **env: str) -> Settings:
    environ = {
        "HOME": str(tmp_path),
        "DRAFTWATCH_DATA_DIR": str(tmp_path / "data"),
        "DRAFTWATCH_DATABASE_URL": db_url,
        "DRAFTWATCH_WEBHOOKS": json.dumps(webhooks or []),
        "DRAFTWATCH_DELIVERY_BACKOFF_BASE_S": "0.01",
        "DRAFTWATCH_DELIVERY_BACKOFF_MAX_S": "0.05",
        "DRAFTWATCH_DELIVERY_TIMEOUT_S": "0.5",
        **env,
    }
    return Settings.from_env(environ, None)


def result(decision: str, effect: float | None, workload: str = "code", test: str = "acceptance") -> DriftResult:
    metric = {"acceptance": "acceptance_rate", "latency": "ms_per_token", "net_loss": "speedup"}[test]
    return DriftResult(
        test=test,
        metric=metric,
        n_ref=200,
        n_cur=200,
        statistic=3.0,
        p=1e-4,
        effect=effect,
        ci=None,
        decision=decision,  # type: ignore[arg-type]
        workload=workload,
        pair="qwen-1.5b/model/qwen-0.5b",
    )


def minutes(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


@dataclass
class Receiver:
    """A real HTTP receiver on 127.0.0.1; ``script`` holds the answers to the next requests.

    Each script entry is an HTTP status, or ``"timeout"`` (sleep past the client's timeout after
    recording the request: the sender retries something that did arrive). When the script is empty
    it answers 200. ``seen`` keeps every request in arrival order; ``processed`` the first of each
    webhook-id, as a receiver that drops duplicates would.
    """

    script: list[int | str] = field(default_factory=list)
    seen: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    processed: dict[str, bytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver.lock:
                    action = receiver.script.pop(0) if receiver.script else 200
                    receiver.seen.append((headers.get("webhook-id", ""), headers, body))
                    if action in (200, "timeout"):
                        receiver.processed.setdefault(headers.get("webhook-id", ""), body)
                if action == "timeout":
                    time.sleep(1.0)
                    return
                self.send_response(int(action))
                if action == 429:
                    self.send_header("Retry-After", "0")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
