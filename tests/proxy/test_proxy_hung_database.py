"""Proxy mode with the monitor's database frozen (SIGSTOP: it accepts and never answers) or stopped (issue 32).

The proxy is in its users' request path: whatever the database does, requests keep their latency,
``/readyz`` stays 200 while the upstream answers, and once the database thaws every record arrives
exactly once. The bounds are generous on purpose (a loaded 2-core machine): they tell a proxy
that waits on the database (seconds, or for ever) from one that does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from monitor.api.app import create_app
from monitor.ingest.recorder import Recorder
from monitor.ingest.spool import Spool
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from tests.api.conftest import make_settings
from tests.private_pg import PrivatePostgres
from tests.proxy.upstream import fixture
from tests.serving import serving

P99_BOUND_S = 1.0
PROBE_TIMEOUT_S = 5.0  # a probe that waited on the frozen database would wait for ever


def stub_upstream() -> Starlette:
    """A chat endpoint whose every answer has an id of its own, so that each request is one record."""
    answer = fixture("vllm", "chat-summary")["response"]

    async def chat(request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse({**answer, "id": f"chatcmpl-{uuid.uuid4().hex}"})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@contextmanager
def proxy(tmp_path: Path, db_url: str, upstream_url: str) -> Iterator[tuple[str, FastAPI]]:
    env = {
        "DRAFTWATCH_PROXY_UPSTREAM": upstream_url,
        "DRAFTWATCH_RECORDER_QUEUE_SIZE": "20",
        "DRAFTWATCH_RECORDER_BATCH_SIZE": "5",
        "DRAFTWATCH_RECORDER_FLUSH_INTERVAL_S": "0.02",
        "DRAFTWATCH_RECORDER_WRITE_TIMEOUT_S": "1",
    }
    app = create_app(make_settings(tmp_path, db_url, **env))
    with serving(app) as base:
        yield base, app


def recorder_of(app: FastAPI) -> Recorder:
    recorder: Recorder = app.state.api.recorder
    return recorder


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def chat_body(n: int) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": f"hi {n}"}]}


def load(client: httpx.Client, count: int, start: int) -> tuple[list[float], list[str]]:
    """``count`` proxied chats from 4 clients at once; their latencies and the ids they were answered with."""

    def one(n: int) -> tuple[float, str]:
        t0 = time.perf_counter()
        response = client.post("/v1/chat/completions", json=chat_body(n))
        elapsed = time.perf_counter() - t0
        assert response.status_code == 200, response.text
        return elapsed, str(response.json()["id"])

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(start, start + count)))
    return [t for t, _ in results], [i for _, i in results]


def test_a_frozen_database_holds_no_proxied_request_and_loses_no_record(
    tmp_path: Path, running_pg: PrivatePostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    append = Spool.append
    on_the_event_loop: list[str] = []

    def watched_append(self: Spool, batch_id: str, records: Any) -> None:
        with contextlib.suppress(RuntimeError):  # raised where no event loop runs: the thread is not the proxy's
            asyncio.get_running_loop()
            on_the_event_loop.append(threading.current_thread().name)
        append(self, batch_id, records)

    monkeypatch.setattr(Spool, "append", watched_append)
    with (
        serving(stub_upstream()) as upstream_url,
        proxy(tmp_path, running_pg.url, upstream_url) as (base, app),
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        recorder = recorder_of(app)
        before, ids = load(client, 40, 0)
        assert recorder.flush(30) and recorder.wait_replayed(30)
        assert recorder.stats().written + recorder.stats().replayed == 40
        running_pg.freeze()
        frozen: list[float] = []
        deadline = time.monotonic() + 60
        # Until the hung write is noticed, and well past it: the queue (20) and its hand-off (20) fill many times over.
        while len(frozen) < 200 or not recorder.stats().database_hung:
            assert time.monotonic() < deadline, "the hung database was never noticed"
            latencies, more = load(client, 20, len(ids))
            frozen += latencies
            ids += more
            ready = client.get("/readyz", timeout=PROBE_TIMEOUT_S)
            assert ready.status_code == 200, ready.text
            assert ready.json()["checks"]["upstream"] == {"ok": True, "reachable": 1, "members": 1}
        health = client.get("/healthz", timeout=PROBE_TIMEOUT_S).json()
        assert health["checks"]["database"]["ok"] is False and health["checks"]["database"]["hung"] is True
        metrics = client.get("/metrics", headers={"Authorization": "Bearer read-token-0123456789ab"}, timeout=30)
        assert metrics.status_code == 200 and "\ndraftwatch_recorder_database_hung 1\n" in metrics.text, metrics.text[
            -600:
        ]
        stats = recorder.stats()
        assert stats.spooled > 0 and stats.dropped == 0
        assert on_the_event_loop == [], "the proxy's event loop wrote to the spool (an fsync per record)"
        assert p99(frozen) < P99_BOUND_S, (p99(before), p99(frozen))
        running_pg.thaw()
        assert recorder.flush(60) and recorder.wait_replayed(60)
        while recorder.stats().database_hung:
            assert time.monotonic() < deadline + 60, "the database thawed, the recorder did not notice"
            time.sleep(0.05)
        engine = create_engine(running_pg.url)
        try:
            with engine.connect() as conn:
                stored = [r[0] for r in conn.execute(text("SELECT request_id FROM requests"))]
        finally:
            engine.dispose()
    assert len(stored) == len(ids) and set(stored) == set(ids)


def test_readyz_in_proxy_mode_follows_the_upstream_not_the_database(
    tmp_path: Path, running_pg: PrivatePostgres
) -> None:
    with (
        serving(stub_upstream()) as upstream_url,
        proxy(tmp_path, running_pg.url, upstream_url) as (base, _),
        httpx.Client(base_url=base, timeout=PROBE_TIMEOUT_S) as client,
    ):
        assert client.get("/readyz").status_code == 200
        running_pg.stop()
        assert client.post("/v1/chat/completions", json=chat_body(0)).status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["checks"] == {"upstream": {"ok": True, "reachable": 1, "members": 1}}
        running_pg.start()
    with proxy(tmp_path, running_pg.url, "http://127.0.0.1:9") as (base, _):  # nothing listens on the discard port
        ready = httpx.get(f"{base}/readyz", timeout=PROBE_TIMEOUT_S)
        assert ready.status_code == 503
        assert ready.json()["checks"]["upstream"] == {"ok": False, "reachable": 0, "members": 1}


def test_the_sidecar_starts_while_the_database_hangs(tmp_path: Path, running_pg: PrivatePostgres) -> None:
    engine = create_engine(running_pg.url)
    upgrade(engine)
    with engine.connect() as conn:  # a pooled connection to a backend that is about to freeze
        conn.execute(text("SELECT 1"))
    running_pg.freeze()
    started = threading.Event()
    outcome: list[int] = []

    def run() -> None:
        app = create_app(make_settings(tmp_path, running_pg.url), engine=engine)
        with TestClient(app) as client:
            started.set()
            outcome.append(client.get("/healthz").status_code)
            # Shut down once the database thaws (a hung migration is abandoned, but its thread is joined at exit).
            assert thawed.wait(60)

    thawed = threading.Event()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert started.wait(30), "the sidecar's start waited on the hung database"
    finally:
        running_pg.thaw()
        thawed.set()
        thread.join(60)
        engine.dispose()
    assert outcome == [200]
