"""A database outage under proxied traffic is two log lines, its start and its end, not one per record (issue 32)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, exc

from monitor.api.app import create_app
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from tests.api.conftest import make_settings
from tests.proxy.upstream import Upstream


def test_an_outage_logs_its_start_and_its_end_once(
    tmp_path: Path, upstream: tuple[Upstream, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, url = upstream
    engine = create_engine(f"sqlite:///{tmp_path / 'proxy.db'}")
    upgrade(engine)
    down = False

    def refuse(*_: Any) -> None:
        if down:  # what a database that went away raises: transient, so the recorder spools
            raise exc.OperationalError("INSERT", None, ConnectionRefusedError("connection refused"))

    event.listen(engine, "before_cursor_execute", refuse)
    # The outage is a hook in this process's engine: the recorder commits here, not through its writer process.
    settings = make_settings(tmp_path, "sqlite:///unused.db", DRAFTWATCH_PROXY_UPSTREAM=url,
                             DRAFTWATCH_RECORDER_BATCH_SIZE="1",
                             DRAFTWATCH_RECORDER_WRITER_PROCESS="false")  # fmt: skip
    body = {"model": "m", "messages": []}
    with caplog.at_level(logging.DEBUG, logger="monitor"), TestClient(create_app(settings, engine=engine)) as client:
        recorder = client.app.state.api.recorder  # type: ignore[attr-defined]
        caplog.clear()
        down = True
        for _ in range(30):
            assert client.post("/v1/chat/completions", json=body).status_code == 200
            assert recorder.flush(10)
        down = False
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert recorder.flush(10) and recorder.wait_replayed(30)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("monitor") and r.levelno >= logging.INFO]
    assert len(lines) == 2, lines
    assert lines[0].startswith("database unreachable") and lines[1].startswith("database reachable again")
    engine.dispose()
