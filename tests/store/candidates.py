"""Waiting for a sidecar's announcement of the candidate pools it serves (monitor/store/candidates.py)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sqlalchemy.engine import Engine

from monitor.proxy.rollout import FRESH
from monitor.store.candidates import Announced, announced


def wait_announced(engine: Engine, deployment: str = "*", timeout_s: float = 30.0) -> list[Announced]:
    """What the sidecars announced for ``deployment`` within ``FRESH``, as rollout start reads it, once there is some:
    a sidecar announces at its start, so none within ``timeout_s`` fails the test."""
    deadline = time.monotonic() + timeout_s
    while not (found := announced(engine, deployment, datetime.now(UTC) - FRESH)):
        assert time.monotonic() < deadline, f"no sidecar announced a candidate pool for {deployment!r} in {timeout_s}s"
        time.sleep(0.05)
    return found
