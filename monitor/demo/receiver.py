"""A local webhook receiver for the demo: verifies each delivery's Standard Webhooks signature and keeps it."""

from __future__ import annotations

import base64
import hmac
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from monitor.notify.signing import signature

log = logging.getLogger(__name__)


@dataclass
class Delivery:
    webhook_id: str
    payload: dict[str, Any]
    verified: bool


@dataclass
class WebhookReceiver:
    """Listens on 127.0.0.1 (port 0 picks a free one); ``on_delivery`` is called for every verified delivery."""

    secret: str
    on_delivery: Callable[[Delivery], None] | None = None
    deliveries: list[Delivery] = field(default_factory=list)
    rejected: int = 0

    def __post_init__(self) -> None:
        self._key = base64.b64decode(self.secret.removeprefix("whsec_"))
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
                receiver._accept(dict(self.headers.items()), body)
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="demo-webhooks", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/alerts"

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, predicate: Callable[[Delivery], bool], timeout: float) -> Delivery | None:
        """The first delivery satisfying ``predicate``, waiting up to ``timeout`` seconds for it."""
        with self._arrived:
            found = self._arrived.wait_for(
                lambda: next((d for d in self.deliveries if predicate(d)), None), timeout=timeout
            )
        return found if isinstance(found, Delivery) else None

    def _accept(self, headers: dict[str, str], body: str) -> None:
        lowered = {k.lower(): v for k, v in headers.items()}
        msg_id, stamp = lowered.get("webhook-id", ""), lowered.get("webhook-timestamp", "0")
        expected = signature(self._key, msg_id, int(stamp) if stamp.isdigit() else 0, body)
        offered = lowered.get("webhook-signature", "").split()
        verified = any(hmac.compare_digest(expected, candidate) for candidate in offered)
        if not verified:
            self.rejected += 1
            log.warning("demo receiver: delivery %s has a bad signature; ignored", msg_id)
            return
        delivery = Delivery(webhook_id=msg_id, payload=json.loads(body), verified=True)
        with self._arrived:
            if any(d.webhook_id == msg_id for d in self.deliveries):
                return  # a retry of one we already have
            self.deliveries.append(delivery)
            self._arrived.notify_all()
        if self.on_delivery is not None:
            self.on_delivery(delivery)
