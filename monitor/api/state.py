"""What the routes share: settings, engine, recorder, tokens, metrics, the optional decoder worker and prompt sample."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request
from sqlalchemy.engine import Engine

from decoder.evaluation import SampleRow
from monitor.api.auth import TokenSet
from monitor.api.decoding.worker import DecodeWorker
from monitor.config import Settings
from monitor.ingest.capture.sidecar import PromptCapture
from monitor.ingest.recorder import Recorder
from monitor.proxy.routing import Router

if TYPE_CHECKING:  # /metrics (metrics.py) renders from ApiState: a run-time import would be a cycle
    from monitor.api.reads.metrics import Metrics


@dataclass(slots=True)
class ApiState:
    settings: Settings
    engine: Engine
    recorder: Recorder
    tokens: TokenSet
    metrics: Metrics
    worker: DecodeWorker | None = None
    # Proxy mode: the upstream pools and the router, and the proxied responses whose figures could not be read.
    router: Router | None = None
    proxy_unrecorded: int = 0
    # The opt-in prompt sample; None while capture.share is 0.
    capture: PromptCapture | None = None
    head_revision: str | None = None
    schema_current: bool = False
    # SQLite has one writer at a time and its busy handler sleeps in growing steps while it waits:
    # queueing writers on a lock here instead is faster and keeps latency even. PostgreSQL needs none.
    write_lock: AbstractContextManager[Any] = field(default_factory=contextlib.nullcontext)
    # The shutdown's phases (monitor/api/server.py): SIGTERM came (draining: /readyz answers 503 while requests
    # are still taken), then the shutdown's limit passed (stopping: what still runs is being ended, not left).
    draining: bool = False
    stopping: bool = False


def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


def offer(request: Request, make: Callable[[], SampleRow | None]) -> None:
    """Offer a request's row to the prompt sample when capture is on (``make`` runs only past the share gate)."""
    capture = api_state(request).capture
    if capture is not None:
        capture.offer(make)
