"""What a replica says about itself reaches each proxied request's record (monitor/proxy/engine_watch.py).

Stand-in engines answer as vLLM and SGLang do today: vLLM ``GET /version`` ({"version"}), its /metrics
with prometheus_client's ``process_start_time_seconds`` and ``vllm:kv_cache_usage_perc{engine,
model_name}`` per engine (vllm/v1/metrics/loggers.py, a fraction despite its name); SGLang ``GET
/get_server_info`` (its ``version`` beside the server's arguments) and ``sglang:token_usage``. A real
llama-server gives its build in ``/props`` and neither gauge. A replica that stops answering the watch is
never ejected for it, and is seen anew when it answers again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from monitor.proxy.engine_state import EngineState
from tests.proxy.engine import flushed, rows, sidecar
from tests.serving import serving, wait_for

STATE = ("engine_version", "replica_uptime_s", "uptime_from", "kv_cache_use", "draft_version")
STARTED = 1_780_000_000.0  # the stand-in vLLM's process start, seconds since the epoch


class Stack:
    """Answers chats, and describes itself as ``kind`` does; ``down`` makes the watch's endpoints fail."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.version = "0.11.2" if kind == "vllm" else "0.5.1"
        self.down = False
        self.answered = 0
        self.asked_version = 0  # GET /version, vLLM's endpoint
        self.asked_info = 0  # GET /get_server_info, SGLang's

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/version", self._version),
            Route("/get_server_info", self._server_info),
            Route("/metrics", self._metrics),
        ])  # fmt: skip

    async def _chat(self, request: Request) -> Response:
        json.loads(await request.body())
        self.answered += 1
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        message = {"role": "assistant", "content": "hello there"}
        return JSONResponse({"id": f"a{self.answered}", "object": "chat.completion", "model": "m", "usage": usage,
                             "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})  # fmt: skip

    async def _version(self, _request: Request) -> Response:
        self.asked_version += 1
        if self.down or self.kind != "vllm":
            return Response(status_code=404 if not self.down else 503)
        return JSONResponse({"version": self.version})

    async def _server_info(self, _request: Request) -> Response:
        self.asked_info += 1
        if self.down or self.kind != "sglang":
            return Response(status_code=404 if not self.down else 503)
        # Its server arguments as SGLang's ServerArgs names them (python/sglang/srt/server_args.py).
        drafting = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/eagle3-m",
                    "speculative_draft_model_revision": None, "speculative_num_steps": 3,
                    "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}  # fmt: skip
        return JSONResponse({"model_path": "m", "tp_size": 1, **drafting, "version": self.version,
                             "internal_states": [{}]})  # fmt: skip

    async def _metrics(self, _request: Request) -> Response:
        if self.down:
            return Response(status_code=503)
        if self.kind == "vllm":
            text = (
                "# TYPE process_start_time_seconds gauge\n"
                f"process_start_time_seconds {STARTED}\n"
                "# TYPE vllm:kv_cache_usage_perc gauge\n"
                'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
                'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75\n'
            )
        else:
            text = '# TYPE sglang:token_usage gauge\nsglang:token_usage{model_name="m"} 0.7\n'
        return PlainTextResponse(text)


def ask(url: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code == 200


def wait_read(app: Any, until: Any) -> None:
    """Until the watcher's read of the (only) replica satisfies ``until``."""
    member = next(iter(app.state.api.router.members()))
    wait_for(lambda: until(member.engine), lambda: member.engine, within_s=10)


@contextmanager
def watched(tmp_path: Path, db_url: str, stack: Stack, every_s: str = "0.2") -> Iterator[tuple[str, Any]]:
    """The stand-in engine served, and the sidecar in front of it reading it every ``every_s``."""
    with (
        serving(stack.app(), log_level="warning") as engine_url,
        sidecar(tmp_path, db_url, engine_url, DRAFTWATCH_PROXY_ENGINE_WATCH_S=every_s) as (url, app),
    ):
        yield url, app


def test_vllm_gives_its_version_process_start_and_kv_use(tmp_path: Path, db_url: str) -> None:
    with watched(tmp_path, db_url, Stack("vllm")) as (url, app):
        wait_read(app, lambda e: e.version is not None)
        before = time.time()
        ask(url)
        flushed(app)
    (row,) = rows(db_url)
    assert row["engine_version"] == "0.11.2" and row["uptime_from"] == "process"
    # The uptime is the request's start less the process's, not the sidecar's sight of it.
    assert row["replica_uptime_s"] == pytest.approx(before - STARTED, abs=5)
    assert row["kv_cache_use"] == pytest.approx(0.5)  # the mean of its two engines


def test_sglang_gives_its_version_and_kv_use_and_is_timed_from_first_sight(tmp_path: Path, db_url: str) -> None:
    stack = Stack("sglang")
    with watched(tmp_path, db_url, stack) as (url, app):
        wait_read(app, lambda e: e.version is not None)
        seen = next(iter(app.state.api.router.members())).engine.started
        ask(url)
        # Down for the watch (never for the chats): not ejected for it, its KV use unknown meanwhile.
        stack.down = True
        wait_read(app, lambda e: not e.answering)
        ask(url)
        stack.down, stack.version = False, "0.5.2"
        wait_read(app, lambda e: e.version == "0.5.2")
        ask(url)
        assert next(iter(app.state.api.router.members())).up
        # SGLang's own endpoint named it: the reads after the first ask it first, not vLLM's /version before it.
        wait_read(app, lambda e: e.version_from == "sglang")
        asked, reads = stack.asked_version, stack.asked_info
        wait_read(app, lambda _: stack.asked_info >= reads + 3)  # three reads more
        assert stack.asked_version == asked
        flushed(app)
    first, gone, back = sorted(rows(db_url), key=lambda r: r["ts_start"])
    assert (first["engine_version"], first["uptime_from"], first["kv_cache_use"]) == ("0.5.1", "first_sight", 0.7)
    assert first["draft_version"] == "EAGLE3 eagle3-m steps=3 topk=1 draft=4"
    assert 0 <= first["replica_uptime_s"] < 10 and seen is not None
    assert gone["kv_cache_use"] is None and gone["engine_version"] == "0.5.1"
    # Answering again, with a new version: a restart as far as the sidecar can tell, timed from its new sight.
    assert back["engine_version"] == "0.5.2" and back["replica_uptime_s"] < gone["replica_uptime_s"] + 1
    assert next(iter(app.state.api.router.members())).engine.started > seen  # type: ignore[operator]


def test_no_watch_leaves_the_fields_empty(tmp_path: Path, db_url: str) -> None:
    with watched(tmp_path, db_url, Stack("vllm"), every_s="0") as (url, app):
        ask(url)
        flushed(app)
    (row,) = rows(db_url)
    assert {k: row[k] for k in STATE} == dict.fromkeys(STATE)


def test_the_state_keeps_a_process_start_and_takes_first_sight_anew_on_a_restart() -> None:
    state = EngineState()
    assert state.fields(100.0) == {"engine_version": None, "replica_uptime_s": None, "uptime_from": None,
                                   "kv_cache_use": None, "draft_version": None}  # fmt: skip
    state.update("b1", None, None, now=100.0, drafter="ngram-simple")
    state.update("b1", None, 0.3, now=130.0)  # the same build answering again, its drafter not named this time
    assert state.fields(160.0) == {"engine_version": "b1", "replica_uptime_s": 60.0, "uptime_from": "first_sight",
                                   "kv_cache_use": 0.3, "draft_version": "ngram-simple"}  # fmt: skip
    state.update("b2", None, None, now=200.0)  # a new build: restarted, its drafter unknown until named
    assert state.fields(210.0)["replica_uptime_s"] == 10.0 and state.fields(210.0)["draft_version"] is None
    state.update("b2", None, None, now=205.0, drafter="ngram-mod")
    state.lost()
    state.update("b2", None, None, now=300.0)  # back after not answering: restarted
    assert state.fields(301.0)["replica_uptime_s"] == 1.0 and state.fields(301.0)["draft_version"] is None
    state.update("b2", 250.0, None, now=400.0)  # a process start given: it is the start
    assert state.fields(400.0) == {"engine_version": "b2", "replica_uptime_s": 150.0, "uptime_from": "process",
                                   "kv_cache_use": None, "draft_version": None}  # fmt: skip
