"""What the routes share: settings, engine, recorder, tokens, metrics and the optional decoder worker."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request
from sqlalchemy.engine import Engine

from monitor.api.auth import TokenSet
from monitor.api.decoding import DecodeWorker
from monitor.api.metrics import Metrics
from monitor.config import Settings
from monitor.recorder import Recorder


@dataclass(slots=True)
class ApiState:
    settings: Settings
    engine: Engine
    recorder: Recorder
    tokens: TokenSet
    metrics: Metrics
    worker: DecodeWorker | None = None
    head_revision: str | None = None
    schema_current: bool = False
    owned: list[str] = field(default_factory=list)


def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state
