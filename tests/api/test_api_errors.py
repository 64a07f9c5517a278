"""Unexpected errors on a real uvicorn server: a JSON 500, logged once without its message, and the
keep-alive connection still serves the next request."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import Request
from fastapi.responses import StreamingResponse

from monitor.api.app import create_app
from tests.api.conftest import READ, auth, make_settings
from tests.serving import serving


def test_a_500_keeps_the_connection_and_is_logged_once(
    tmp_path: Path, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(make_settings(tmp_path, sqlite_url))

    def fail(request: Request) -> None:
        raise RuntimeError(f"quoting the request: {request.headers['x-probe']}")

    app.add_api_route("/v1/test-failure", fail)
    with caplog.at_level(logging.INFO), serving(app) as base, httpx.Client(base_url=base, headers=auth(READ)) as client:
        for _ in range(3):
            failed = client.get("/v1/test-failure", headers={"x-probe": "header-value-3e8"})
            assert failed.status_code == 500
            assert failed.json() == {"error": "internal_error", "message": "the server failed to handle the request"}
            assert failed.headers.get("connection") != "close"
            assert client.get("/v1/jobs").status_code == 200  # the same connection, still usable
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.name for r in errors] == ["monitor.api.errors"] * 3  # not a second time by the server
    assert "RuntimeError" in caplog.text and "header-value-3e8" not in caplog.text
    clients = {r.args[0] for r in caplog.records if r.name == "uvicorn.access" and isinstance(r.args, tuple)}
    assert len(clients) == 1, clients  # one keep-alive connection served all six requests


def test_an_error_mid_response_closes_that_connection(
    tmp_path: Path, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(make_settings(tmp_path, sqlite_url))

    def fail_midway(request: Request) -> StreamingResponse:
        def parts() -> Iterator[bytes]:
            yield b"data: first\n\n"
            raise RuntimeError(f"quoting the request: {request.headers['x-probe']}")

        return StreamingResponse(parts(), media_type="text/event-stream")

    app.add_api_route("/v1/test-failure", fail_midway)
    with caplog.at_level(logging.INFO), serving(app) as base, httpx.Client(base_url=base, headers=auth(READ)) as client:
        with pytest.raises(httpx.RemoteProtocolError):  # the headers said 200: only a closed connection says "broken"
            client.get("/v1/test-failure", headers={"x-probe": "header-value-3e8"})
        assert client.get("/v1/jobs").status_code == 200  # on a new connection
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.name for r in errors] == ["monitor.api.errors", "uvicorn.error"]
    assert "RuntimeError" in errors[0].getMessage() and "ResponseCutShortError" in caplog.text
    assert "header-value-3e8" not in caplog.text
