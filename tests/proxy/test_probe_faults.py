"""A probe never freezes the proxy (issue 37, item 4): ``/healthz`` is read on the event loop that forwards
every request, so it must not wait on the spool's lock, which the spool holds across ``fsync``.

The fault is injected: ``fsync`` takes 0.3 s (a slow or busy disk) while the recorder spools, the
database being away. Probes that waited for the lock stalled every proxied request for the
fsync's remainder (p99 8 -> 307 ms); the bound below is generous (a loaded 2-core machine) and
still well under one fsync.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from decoder.record import RequestRecord
from monitor.api.app import create_app
from monitor.ingest.recorder import Recorder
from tests.api.conftest import make_settings
from tests.proxy.upstream import Upstream
from tests.serving import free_port, serving

FSYNC_S = 0.3
BOUND_S = 0.15  # a request that waited for one fsync took >= 0.3 s
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@contextmanager
def spooling_proxy(tmp_path: Path, upstream_url: str) -> Iterator[tuple[httpx.Client, Recorder]]:
    """The sidecar in proxy mode on real HTTP, its database refusing (nothing listens), so records spool."""
    away = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/draftwatch"
    app: FastAPI = create_app(make_settings(tmp_path, away, DRAFTWATCH_PROXY_UPSTREAM=upstream_url))
    with serving(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        yield client, app.state.api.recorder


def keep_spooling(recorder: Recorder, stop: threading.Event) -> None:
    """Durable records one after another (recorder.spool_before_reply's path): the spool is always in an fsync."""
    t = datetime.now(UTC)
    number = 0
    while not stop.is_set():
        number += 1
        rec = RequestRecord(f"durable-{number}", t, t, "chat", "m", "none", mode="plain", source="api")
        recorder.record_durable(rec).result(30)


def probe(client: httpx.Client, stop: threading.Event, latencies: list[float]) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        assert client.get("/healthz").status_code == 200
        latencies.append(time.perf_counter() - t0)


def p90(latencies: list[float]) -> float:
    return sorted(latencies)[int(0.9 * (len(latencies) - 1))]


def test_probes_during_slow_fsyncs_do_not_delay_proxied_requests(
    tmp_path: Path, upstream: tuple[Upstream, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, upstream_url = upstream
    fsync = os.fsync
    fsyncs: list[float] = []

    def slow_fsync(fd: int) -> None:
        fsync(fd)
        fsyncs.append(time.monotonic())
        time.sleep(FSYNC_S)

    with spooling_proxy(tmp_path, upstream_url) as (client, recorder):
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        monkeypatch.setattr(os, "fsync", slow_fsync)  # the spool's, and any other writer's meanwhile
        stop = threading.Event()
        probes: list[float] = []
        threads = [
            threading.Thread(target=keep_spooling, args=(recorder, stop), daemon=True),
            threading.Thread(target=probe, args=(client, stop, probes), daemon=True),
        ]
        for thread in threads:
            thread.start()
        proxied = []
        try:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
                proxied.append(time.perf_counter() - t0)
            health = client.get("/healthz").json()["checks"]["database"]
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
        # The fault was there: the recorder spooled, fsync after slow fsync, all along.
        assert health["ok"] is False and health["spool_pending"] is True
        assert len(fsyncs) >= 5 and recorder.stats().spooled > 0
        assert len(probes) >= 5
        assert p90(proxied) < BOUND_S, (p90(proxied), max(proxied), len(proxied))
        assert p90(probes) < BOUND_S, (p90(probes), max(probes), len(probes))
