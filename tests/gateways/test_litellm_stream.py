"""Streamed answers through a real LiteLLM proxy, recorded by a real draftwatch as non-streamed ones are.

Behind LiteLLM (``scripts/ensure-litellm.sh``'s, run by tests/stacks/litellm.py as for tests/deploy) are
stand-ins for vLLM and llama.cpp that stream as each engine does: vLLM's speculative figures in
``metrics`` on the final usage chunk (choices empty, sent only when ``stream_options.include_usage``
is asked), llama.cpp's ``timings`` on the last chunk (the usage chunk once usage is asked). Each
stand-in waits before its first chunk and between chunks, so that the gateway's own TTFT and decode
time can be told from the engine's figures. draftwatch is ``draftwatch serve`` over SQLite; the
records are read from its database. One LiteLLM proxy per stack: the integration reports to
``/v1/events/{stack}``. The llama.cpp gateway runs with ``always_include_stream_usage: false``, so
that the integration, not LiteLLM, asks the engine for its usage.

Without LiteLLM installed the tests skip, except under ``CI=true`` (as tests/deploy/test_litellm.py).
"""

from __future__ import annotations

import asyncio
import copy
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import httpx
import pytest
from sqlalchemy import Engine as Database
from sqlalchemy import select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from monitor.proxy.rollout import abort, start_rollout
from monitor.proxy.settings import ProxySettings, RolloutSettings
from monitor.store.engine import create_engine
from monitor.store.models import RequestRow
from monitor.store.rollouts import CURRENT_DRAFTER
from tests.api.conftest import ADMIN
from tests.proxy.upstream import fixture
from tests.serving import free_port, serve_process, serving
from tests.stacks.litellm import SETTINGS, LiteLLMProxy, litellm_proxy, require_litellm

PIECES: Final = ("Hel", "lo", " the", "re")
FIRST_S: Final = 0.3  # before the first chunk: the gateway's TTFT is at least this
BETWEEN_S: Final = 0.05  # between chunks: the decode phase, first to last text chunk, is at least 3 of these
# A prompt with "slow" in it: 40 chunks 0.2 s apart, the last at least FIRST_S + 7.8 s after the request, so that
# the first chunk's time and the last's are far apart.
SLOW_PIECES: Final = PIECES * 10
SLOW_BETWEEN_S: Final = BETWEEN_S * 4
CANDIDATE: Final = "ngram-m16"
VLLM: Final = fixture("vllm", "chat-stream-final-chunk-length")["response"]
LLAMACPP: Final = fixture("llamacpp", "chat-stream-final-usage-chunk")["response"]


@dataclass
class Engine:
    """A stand-in engine's stream: ``stack``'s shape; ``speculative`` whether it reports drafts."""

    stack: str
    name: str
    speculative: bool
    asked_usage: list[bool] = field(default_factory=list)
    served: int = 0

    def final(self) -> dict[str, Any]:
        """What the engine adds at its end: vLLM's usage and metrics, llama.cpp's usage and timings."""
        if self.stack == "vllm":
            end = {"usage": copy.deepcopy(VLLM["usage"]), "metrics": copy.deepcopy(VLLM["metrics"])}
            # Started without --enable-per-request-metrics: no timings, the decode time is the stream's.
            for timing in ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms"):
                del end["metrics"][timing]
            if not self.speculative:
                del end["metrics"]["speculative_decoding"]
        else:
            end = {"usage": copy.deepcopy(LLAMACPP["usage"]), "timings": copy.deepcopy(LLAMACPP["timings"])}
            if not self.speculative:
                del end["timings"]["draft_n"], end["timings"]["draft_n_accepted"]
        return end

    async def chat(self, request: Request) -> StreamingResponse:
        body = await request.json()
        usage = (body.get("stream_options") or {}).get("include_usage") is True
        self.asked_usage.append(usage)
        self.served += 1
        request_id = f"chatcmpl-{self.name}-{self.served}-{secrets.token_hex(4)}"
        prompt = body["messages"][-1]["content"]
        base = {"id": request_id, "object": "chat.completion.chunk", "created": 1, "model": "target-m"}

        async def events() -> AsyncIterator[bytes]:
            await asyncio.sleep(FIRST_S)
            pieces, between = (SLOW_PIECES, SLOW_BETWEEN_S) if "slow" in prompt else (PIECES, BETWEEN_S)
            for i, piece in enumerate(pieces):
                if "break" in prompt and i == 2:
                    raise RuntimeError("the engine died mid-stream")  # uvicorn cuts the connection
                choice = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                yield f"data: {json.dumps({**base, 'choices': [choice]})}\n\n".encode()
                await asyncio.sleep(between)
            last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
            end = self.final()
            if usage:
                yield f"data: {json.dumps(last)}\n\n".encode()
                last = {**base, "choices": [], **end}
            elif self.stack == "llamacpp":
                last = {**last, "timings": end["timings"]}  # no usage asked: timings on the finish chunk
            yield f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode()

        return StreamingResponse(events(), media_type="text/event-stream")


@dataclass
class Gateway:
    """LiteLLM (``proxy``) before the stand-in ``engines`` of ``stack``, draftwatch's database ``db`` behind it."""

    stack: str
    proxy: LiteLLMProxy
    db: Database
    engines: dict[str, Engine]

    def stream(self, workload: str, *, prompt: str = "Say hello.", usage: bool | None = None) -> list[dict[str, Any]]:
        """One streamed chat for ``smol``; the chunks the client got."""
        body: dict[str, Any] = {"model": "smol", "messages": [{"role": "user", "content": prompt}], "stream": True,
                                "max_tokens": 16}  # fmt: skip
        if usage is not None:
            body["stream_options"] = {"include_usage": usage}
        headers = {"Authorization": f"Bearer {self.proxy.key}", "X-Workload": workload}
        with httpx.stream("POST", f"{self.proxy.url}/v1/chat/completions", json=body, headers=headers,
                          timeout=60) as r:  # fmt: skip
            assert r.status_code == 200, r.read()
            return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]

    def records(self, workload: str, n: int) -> list[dict[str, Any]]:
        """The ``n`` records of ``workload``, once draftwatch has them (the reports are posted after the answer)."""
        deadline = time.monotonic() + 30
        while len(found := self.stored(workload)) < n:
            assert time.monotonic() < deadline, f"{n - len(found)} of {n} records never came:\n" + self.proxy.tail()
            time.sleep(0.1)
        time.sleep(0.3)  # none more comes
        found = self.stored(workload)
        assert len(found) == n, found
        return sorted(found, key=lambda r: r["ts_start"])

    def stored(self, workload: str) -> list[dict[str, Any]]:
        with self.db.connect() as conn:
            query = select(RequestRow.__table__).where(RequestRow.__table__.c.workload == workload)
            return [dict(r._mapping) for r in conn.execute(query)]

    def until_served_by(self, name: str) -> None:
        """Throwaway streams (workload ``warm-up``) until the deployment ``name`` answers one: the integration's gate
        has read the rollout just started or ended (it reads them every 0.2 s)."""
        engine = self.engines[name]
        served = engine.served
        deadline = time.monotonic() + 30
        while engine.served == served:
            assert time.monotonic() < deadline, f"{name} served nothing in 30 s:\n" + self.proxy.tail()
            self.stream("warm-up")


@pytest.fixture(scope="module", params=["vllm", "llamacpp"])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    stack: str = request.param
    require_litellm()  # before draftwatch starts: skipped without LiteLLM
    tmp = tmp_path_factory.mktemp(f"litellm-{stack}")
    db_url = f"sqlite:///{tmp / 'draftwatch.db'}"
    port = free_port()
    draftwatch = serve_process(tmp, db_url, port)
    db = create_engine(db_url)
    engines = {
        name: Engine(stack, name, speculative=name != "smol-plain") for name in ("smol", "smol-plain", "smol-next")
    }
    env = {
        **SETTINGS,
        "DRAFTWATCH_LITELLM_URL": f"http://127.0.0.1:{port}",
        "DRAFTWATCH_LITELLM_TOKEN": ADMIN,
        "DRAFTWATCH_LITELLM_STACK": stack,
    }
    # llama.cpp's gateway does not ask for the usage chunk itself: the integration does.
    general = {"always_include_stream_usage": False} if stack == "llamacpp" else None
    try:
        with ExitStack() as stack_of:
            urls = {name: stack_of.enter_context(serving(Starlette(routes=[Route("/v1/chat/completions", e.chat,
                                                                                 methods=["POST"])])))
                    for name, e in engines.items()}  # fmt: skip
            proxy = stack_of.enter_context(litellm_proxy(tmp, urls, env, general, target="target-m"))
            yield Gateway(stack, proxy, db, engines)
    finally:
        db.dispose()
        draftwatch.terminate()
        draftwatch.wait(15)


def expected_counts(gateway: Gateway, speculative: bool) -> tuple[int, int, int]:
    """(output tokens, drafted, accepted) as the engine's final chunk says them."""
    end = gateway.engines["smol"].final()
    if gateway.stack == "vllm":
        spec = end["metrics"]["speculative_decoding"]
        drafts = (spec["num_draft_tokens"], spec["num_accepted_draft_tokens"])
    else:
        drafts = (end["timings"]["draft_n"], end["timings"]["draft_n_accepted"])
    return (end["usage"]["completion_tokens"], *(drafts if speculative else (0, 0)))


def text(chunks: list[dict[str, Any]]) -> str:
    """The answer's text, as the client read it off the chunks."""
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def latency_ms(record: dict[str, Any]) -> float:
    """The record's start to its end, on the gateway's clock (as its TTFT and its decode time)."""
    return float((record["ts_end"] - record["ts_start"]).total_seconds() * 1000)


def test_a_streamed_answer_is_recorded_with_the_engine_s_counts_the_gateway_s_timings_and_its_declared_mode(
    gateway: Gateway,
) -> None:
    engine, plain = gateway.engines["smol"], gateway.engines["smol-plain"]
    held = plain.served
    # Each 4 consecutive requests of a workload hold one out (share 0.25, systematic).
    streams = [gateway.stream("streamed") for _ in range(4)]
    records = gateway.records("streamed", 4)
    assert sorted(r["mode"] for r in records) == ["holdout", "speculative", "speculative", "speculative"]
    assert plain.served - held == 1
    assert all(engine.asked_usage)  # the engine was asked for its usage, though the client did not ask
    for chunks in streams:  # and the client did not get the usage chunk it did not ask for
        assert not [c for c in chunks if c.get("usage")], chunks
        assert text(chunks) == "".join(PIECES)
    for record in records:
        speculative = record["mode"] == "speculative"
        assert (record["output_tokens"], record["num_draft_tokens"], record["num_accepted_tokens"]) == expected_counts(
            gateway, speculative
        ), {k: record[k] for k in ("error", "finish_reason", "mode", "ttft_ms", "request_id")}
        assert record["drafter"] == (CURRENT_DRAFTER if speculative else "unknown")
        assert not record["mode_inferred"] and record["finish_reason"] == "length" and record["error"] is None
        assert record["target_model"] == "target-m" and record["source"] == f"proxy:{gateway.stack}"
        assert record["request_id"].startswith("chatcmpl-smol")
        # TTFT in milliseconds as the gateway saw it (the engines wait FIRST_S before the first chunk); which chunk
        # it is timed by: the slow stream's test.
        assert FIRST_S * 1000 <= record["ttft_ms"] < latency_ms(record), record
        if gateway.stack == "llamacpp":  # the engine's own decode time: timings.predicted_ms
            assert record["decode_ms"] == pytest.approx(LLAMACPP["timings"]["predicted_ms"])
        else:  # none of its own: the stream's, first to last text chunk as LiteLLM passed them on, the last at least
            # FIRST_S and 3 pauses after the start
            assert record["ttft_ms"] + record["decode_ms"] >= (FIRST_S + 3 * BETWEEN_S) * 1000, record
            assert record["ttft_ms"] + record["decode_ms"] <= latency_ms(record) + 1, record
        assert record["ts_end"] > record["ts_start"]
    assert "refused" not in gateway.proxy.tail() and "hook failed" not in gateway.proxy.tail(), gateway.proxy.tail()


def test_a_stream_s_ttft_is_its_first_chunk_s_and_its_decode_time_spans_its_text_chunks(gateway: Gateway) -> None:
    # 40 chunks 0.2 s apart: the engine sends the last text chunk at least FIRST_S + 7.8 s after the request, the
    # first FIRST_S after it. The gateway's clock can see each later than sent (a loaded machine), never earlier.
    pauses_ms = (len(SLOW_PIECES) - 1) * SLOW_BETWEEN_S * 1000
    chunks = gateway.stream("slow", prompt="Say hello, slow.")
    assert text(chunks) == "".join(SLOW_PIECES)
    (record,) = gateway.records("slow", 1)
    assert record["finish_reason"] == "length" and record["error"] is None, record
    assert latency_ms(record) >= FIRST_S * 1000 + pauses_ms, record
    # The first chunk's time, not the last's: well before the end (by half the pauses at the least, the other half
    # left for the first chunk's delays on a loaded machine).
    assert FIRST_S * 1000 <= record["ttft_ms"] <= latency_ms(record) - pauses_ms / 2, record
    if gateway.stack == "llamacpp":  # the engine's own: not the stream's
        assert record["decode_ms"] == pytest.approx(LLAMACPP["timings"]["predicted_ms"])
    else:  # the stream's, first to last text chunk: it ends no earlier than the last was sent, and spans most pauses
        assert record["ttft_ms"] + record["decode_ms"] >= FIRST_S * 1000 + pauses_ms, record
        assert pauses_ms / 2 <= record["decode_ms"] <= latency_ms(record) - record["ttft_ms"] + 1, record


def test_a_client_that_asks_for_usage_gets_it_and_the_record_is_the_same(gateway: Gateway) -> None:
    # Four, one of them held out: where in the four is drawn per process (decoder/holdout.py's process seed).
    for _ in range(4):
        chunks = gateway.stream("asked", usage=True)
        used = [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")]
        assert used == [expected_counts(gateway, True)[0]]
    records = gateway.records("asked", 4)
    assert sorted(r["mode"] for r in records) == ["holdout", "speculative", "speculative", "speculative"]
    for record in records:
        counts = (record["output_tokens"], record["num_draft_tokens"], record["num_accepted_tokens"])
        assert counts == expected_counts(gateway, record["mode"] == "speculative")


def test_a_rollout_s_candidate_streams_are_recorded_under_its_drafter(gateway: Gateway) -> None:
    candidate = gateway.engines["smol-next"]
    pool = ProxySettings(upstream=("http://smol:8080",), candidate_upstream=("http://smol-next:8080",))
    rollout = start_rollout(gateway.db, pool, RolloutSettings(steps=(1.0,), drafter=CANDIDATE), datetime.now(UTC))
    assert rollout.id is not None
    try:
        gateway.until_served_by("smol-next")  # the gate serves the rollout
        served = candidate.served
        for _ in range(4):
            gateway.stream("canary")
        records = gateway.records("canary", 4)
        assert sorted((r["mode"], r["drafter"]) for r in records) == [
            ("holdout", "unknown"), *[("speculative", CANDIDATE)] * 3
        ]  # fmt: skip
        assert candidate.served - served == 3
        assert all(r["num_draft_tokens"] > 0 for r in records if r["mode"] == "speculative")
    finally:
        abort(gateway.db, rollout.id, datetime.now(UTC))
        gateway.until_served_by("smol")  # the gate has read the abort: the current drafter serves again


def test_a_stream_cut_short_or_left_by_its_client_is_recorded_as_an_error(gateway: Gateway) -> None:
    # The engine dies after two chunks: LiteLLM ends the client's stream with an error event.
    gateway.stream("cut", prompt="Say hello, then break.")
    (cut,) = gateway.records("cut", 1)
    assert cut["finish_reason"] == "error" and cut["error"].startswith("the upstream's stream failed"), cut
    assert cut["mode"] in ("speculative", "holdout") and cut["ttft_ms"] >= FIRST_S * 1000
    assert cut["request_id"].startswith("chatcmpl-smol") and cut["target_model"] == "target-m"

    # The client reads one chunk of a slow answer and leaves.
    body = {"model": "smol", "messages": [{"role": "user", "content": "slow"}], "stream": True}
    headers = {"Authorization": f"Bearer {gateway.proxy.key}", "X-Workload": "left"}
    url = f"{gateway.proxy.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as r:
        next(line for line in r.iter_lines() if line.startswith("data: {"))
    (left,) = gateway.records("left", 1)
    assert (left["finish_reason"], left["error"]) == ("error", "client disconnected"), left
    assert left["output_tokens"] == 0 and left["num_draft_tokens"] == 0
