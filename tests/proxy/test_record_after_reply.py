"""A whole answer, and a stream's end, reach the client before their record is made: the client never waits for
the report's parsing, the record's checks and its causes (issue 49, the proxy's added latency). Under
recorder.spool_before_reply the record is on disk first, as that setting promises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from decoder.record import RequestRecord
from monitor.api.app import create_app
from monitor.api.server import uvicorn_options
from tests.api.conftest import make_settings
from tests.proxy.engine import Engine, flushed, rows
from tests.serving import serving

ASK = {"model": "qwen-coder", "messages": [{"role": "user", "content": "hi"}]}


class Watched:
    """The sidecar's app, noting how many records its recorder had been handed when each answer ended for the
    client, once per answer: at a whole answer's last body message, or at the message carrying a stream's
    ``[DONE]`` (however many messages follow it)."""

    def __init__(self, tmp_path: Path, db_url: str, upstream: str, **env: str) -> None:
        self.settings = make_settings(tmp_path, db_url, DRAFTWATCH_PROXY_UPSTREAM=upstream, **env)
        self.app = create_app(self.settings)
        self.handed: list[RequestRecord] = []
        self.at_end: list[int] = []

    def spy(self) -> None:
        """Count the hand-overs: the recorder itself still takes and writes every record."""
        recorder = self.app.state.api.recorder
        for name in ("record_nowait", "record_durable"):
            real = getattr(recorder, name)

            def counted(rec: RequestRecord, real: Any = real) -> Any:
                self.handed.append(rec)
                return real(rec)

            setattr(recorder, name, counted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        ended = False  # noted once per answer, at the first message that ends it (a stream's [DONE] comes first)

        async def noted(message: Message) -> None:
            nonlocal ended
            await send(message)
            body = message.get("body", b"")
            last = b"[DONE]" in body or not message.get("more_body")
            if message["type"] == "http.response.body" and last and not ended:
                ended = True
                self.at_end.append(len(self.handed))

        await self.app(scope, receive, noted)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_answer_ends_before_its_record_is_made(tmp_path: Path, db_url: str, stream: bool) -> None:
    engine = Engine()
    engine.number_answers = True
    with serving(engine.app(), log_level="warning") as upstream:
        watched = Watched(tmp_path, db_url, upstream)
        with serving(watched, **uvicorn_options(watched.settings.api), log_level="warning") as url:
            watched.spy()
            with httpx.Client(base_url=url, timeout=30) as client:
                for number in range(1, 6):
                    answer = client.post("/v1/chat/completions", json={**ASK, "stream": stream})
                    assert answer.status_code == 200
                    # A flush right after the answer finds its record stored, made after the answer or not.
                    flushed(watched.app)
                    assert len(rows(db_url)) == number
    # Each answer ended for its client with only the earlier requests' records made: its own came after.
    assert watched.at_end == [0, 1, 2, 3, 4]
    stored = rows(db_url)
    assert len(stored) == 5
    assert all(row["ts_end"] > row["ts_start"] and row["latency_ms"] > 0 for row in stored)
    assert {row["request_id"] for row in stored} == {r.request_id for r in watched.handed}


def test_spool_before_reply_still_has_the_record_first(tmp_path: Path, db_url: str) -> None:
    engine = Engine()
    engine.number_answers = True
    with serving(engine.app(), log_level="warning") as upstream:
        watched = Watched(tmp_path, db_url, upstream, DRAFTWATCH_RECORDER_SPOOL_BEFORE_REPLY="1")
        with serving(watched, **uvicorn_options(watched.settings.api), log_level="warning") as url:
            watched.spy()
            with httpx.Client(base_url=url, timeout=30) as client:
                for _ in range(3):
                    assert client.post("/v1/chat/completions", json=ASK).status_code == 200
        flushed(watched.app)
    assert watched.at_end == [1, 2, 3]
    assert len(rows(db_url)) == 3
