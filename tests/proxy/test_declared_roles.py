"""Which requests are speculative is declared by the deployment, not read off the answer (issue 36).

An n-gram drafter proposes nothing where the prompt holds no match, and llama.cpp's answer then
carries no draft counts. Behind a proxy with a plain baseline the pool behind ``proxy.upstream``
is speculative by declaration: those requests paid for speculation and are stored speculative with
0 drafts, so that the verdict answers "does turning speculation on pay" rather than "is it fast
when it drafts". Without a baseline, ``proxy.speculative = auto`` infers the mode per answer: a
zero-draft answer is stored plain but flagged ``mode_inferred``, and no speedup counts it as a
baseline. The stand-ins answer as llama-server b11434 does (tests/fixtures/stacks/llamacpp/); the
real llama-server's n-gram drafter is tested in tests/proxy/test_proxy_llama_server.py.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from monitor.commands.main import main
from monitor.drift.run import run_drift
from monitor.drift.verdict import HOW_TO_MEASURE, verdict_of
from monitor.proxy.decide import decide_routes
from monitor.proxy.rollout import start_rollout
from monitor.store.engine import create_engine
from tests.api.conftest import make_settings
from tests.proxy.engine import flushed, rows, sidecar
from tests.proxy.upstream import Upstream, fixture, serving

DRAFTING = fixture("llamacpp", "real-b11434-chat-draft")["response"]
# The same answer from a request the n-gram drafter found no match for: llama.cpp leaves both counts out.
NOT_DRAFTING = copy.deepcopy(DRAFTING)
del NOT_DRAFTING["timings"]["draft_n"], NOT_DRAFTING["timings"]["draft_n_accepted"]
PER_WORKLOAD = 40
# Lowered from 30 so that one short run decides; the windows hold this run alone.
DRIFT = {"DRAFTWATCH_DRIFT_MIN_REQUESTS": "10", "DRAFTWATCH_DRIFT_CURRENT_WINDOW": "30m",
         "DRAFTWATCH_DRIFT_MAX_CURRENT_WINDOW": "30m", "DRAFTWATCH_DRIFT_REFERENCE_WINDOW": "1h"}  # fmt: skip


class LlamaServerStandIn(Upstream):
    """llama-server's chat answers: drafting only where the prompt says ``copy``, ``slowdown`` x plain's decode time.

    Each answer has an id of its own (the record's request_id) and a decode time that varies a
    little from request to request, as a real server's does.
    """

    def __init__(self, *, speculative: bool, slowdown: float = 1.0) -> None:
        super().__init__()
        self.speculative = speculative
        self.slowdown = slowdown
        self._ids = itertools.count()

    async def _chat(self, request: Request) -> Response:
        body = await self._remember(request) or {}
        number = next(self._ids)
        prompt = str(body.get("messages", ""))
        answer = copy.deepcopy(DRAFTING if self.speculative and "copy" in prompt else NOT_DRAFTING)
        answer["id"] = f"chatcmpl-{'spec' if self.speculative else 'plain'}-{number}"
        timings = answer["timings"]
        timings["predicted_ms"] = timings["predicted_n"] * 20.0 * self.slowdown * (1 + (number % 7) / 50)
        return JSONResponse(answer)


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'proxy.db'}"


@pytest.fixture
def engines() -> Iterator[tuple[LlamaServerStandIn, str, LlamaServerStandIn, str]]:
    """A speculative server 25 % slower than the plain one (llama.cpp's n-gram drafter on qa: 0.80x)."""
    spec, plain = LlamaServerStandIn(speculative=True, slowdown=1.25), LlamaServerStandIn(speculative=False)
    with ExitStack() as stack:
        yield spec, stack.enter_context(serving(spec)), plain, stack.enter_context(serving(plain))


def ask(url: str, workloads: dict[str, str], **fields: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(PER_WORKLOAD):
            for workload, prompt in workloads.items():
                body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 24, **fields}
                response = client.post("/v1/chat/completions", json=body, headers={"X-Workload": workload})
                assert response.status_code == 200, response.text


def net_loss(db_url: str, app: FastAPI) -> dict[str, Any]:
    flushed(app)
    engine = create_engine(db_url)
    try:
        run = run_drift(engine, app.state.api.settings.drift, datetime.now(UTC) + timedelta(seconds=1))
    finally:
        engine.dispose()
    return {r.workload: r for r in run.results if r.test == "net_loss"}


def test_with_a_baseline_a_request_that_drafted_nothing_is_speculative_and_the_net_loss_is_found(
    tmp_path: Path, db_url: str, engines: tuple[LlamaServerStandIn, str, LlamaServerStandIn, str]
) -> None:
    _, spec_url, _, plain_url = engines
    env = {"DRAFTWATCH_PROXY_BASELINE_UPSTREAM": plain_url, "DRAFTWATCH_DECODER_HOLDOUT_SHARE": "0.5",
           "DRAFTWATCH_DECODER_HOLDOUT_MAX_SHARE": "0.5", "DRAFTWATCH_DECODER_HOLDOUT_TARGET": "0",
           **DRIFT}  # fmt: skip
    with sidecar(tmp_path, db_url, spec_url, **env) as (url, app):
        # qa: nothing the drafter can copy from, so the speculative server never drafts (the qa case).
        ask(url, {"qa": "What is the capital of France?", "extract": "copy this: apples, pears, plums"})
        found = net_loss(db_url, app)
    stored = rows(db_url)
    qa = [r for r in stored if r["workload"] == "qa"]
    by_pool = {pool: [r for r in qa if r["request_id"].startswith(f"chatcmpl-{pool}")] for pool in ("spec", "plain")}
    assert len(by_pool["spec"]) == len(by_pool["plain"]) == PER_WORKLOAD // 2
    # Every answer of the speculative pool is speculative, with 0 drafts where it drafted nothing.
    assert {(r["mode"], r["num_draft_tokens"], r["mode_inferred"]) for r in by_pool["spec"]} == {("speculative", 0, 0)}
    assert {(r["mode"], r["holdout_reason"]) for r in by_pool["plain"]} == {("holdout", "share")}
    extract = [r for r in stored if r["workload"] == "extract" and r["request_id"].startswith("chatcmpl-spec")]
    assert {(r["mode"], r["num_draft_tokens"]) for r in extract} == {("speculative", 17)}
    # The 0.8x loss is found on the workload's own baseline, for the workload whose requests never drafted.
    for workload in ("qa", "extract"):
        verdict = verdict_of(found[workload])
        assert (verdict.verdict, verdict.measured) == ("net_loss", True), (workload, verdict)
        assert verdict.speedup == pytest.approx(0.8, abs=0.03)
        assert (verdict.n_speculative, verdict.n_plain) == (PER_WORKLOAD // 2, PER_WORKLOAD // 2)


def test_without_a_baseline_auto_flags_a_zero_draft_answer_and_no_estimate_counts_it_as_plain(
    tmp_path: Path, db_url: str, engines: tuple[LlamaServerStandIn, str, LlamaServerStandIn, str]
) -> None:
    _, spec_url, _, _ = engines
    with sidecar(tmp_path, db_url, spec_url, **DRIFT) as (url, app):
        ask(url, {"qa": "What is the capital of France?", "extract": "copy this: apples, pears, plums"})
        found = net_loss(db_url, app)
    modes = {(r["workload"], r["mode"], r["mode_inferred"]) for r in rows(db_url)}
    assert modes == {("qa", "plain", 1), ("extract", "speculative", 0)}
    # qa's answers were never a baseline: extract's speedup is not estimated from them.
    verdict = verdict_of(found["extract"])
    assert (verdict.verdict, verdict.reason, verdict.n_plain) == ("not_measured", HOW_TO_MEASURE, 0)
    assert "qa" not in found  # nothing speculated there, as far as anyone declared


def test_proxy_speculative_true_declares_the_role_without_a_baseline(
    tmp_path: Path, db_url: str, engines: tuple[LlamaServerStandIn, str, LlamaServerStandIn, str]
) -> None:
    _, spec_url, _, _ = engines
    with sidecar(tmp_path, db_url, spec_url, DRAFTWATCH_PROXY_SPECULATIVE="true") as (url, app):
        ask(url, {"qa": "What is the capital of France?"})
        flushed(app)
    assert {(r["mode"], r["num_draft_tokens"], r["mode_inferred"]) for r in rows(db_url)} == {("speculative", 0, 0)}


def test_a_failed_request_of_the_speculative_pool_keeps_its_declared_role(tmp_path: Path, db_url: str) -> None:
    spec, plain = Upstream(), Upstream()
    spec.fail_with = 503
    with serving(spec) as spec_url, serving(plain) as plain_url:
        # No holdout: its schedule starts at a place of the process's own, and this one request must be speculative.
        env = {"DRAFTWATCH_PROXY_BASELINE_UPSTREAM": plain_url, "DRAFTWATCH_DECODER_HOLDOUT_TARGET": "0",
               "DRAFTWATCH_DECODER_HOLDOUT_SHARE": "0"}  # fmt: skip
        with sidecar(tmp_path, db_url, spec_url, **env) as (url, app):
            body = {"messages": [{"role": "user", "content": "hi"}]}
            assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).status_code == 503
            flushed(app)
    assert [(r["mode"], r["finish_reason"], r["mode_inferred"]) for r in rows(db_url)] == [("speculative", "error", 0)]


@pytest.mark.parametrize("declared", ["false", "baseline", "candidate"])
def test_serve_refuses_a_baseline_beside_a_pool_declared_plain_or_another_pool_s_role(
    declared: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTWATCH_PROXY_SPECULATIVE", declared)
    assert main(["serve", "--upstream", "http://127.0.0.1:9", "--baseline-upstream", "http://127.0.0.1:10"]) == 2
    assert f"proxy.speculative={declared} with a plain baseline" in capsys.readouterr().err


def test_behind_a_gateway_the_baseline_s_own_sidecar_stores_its_answers_as_the_holdout_and_the_loss_routes(
    tmp_path: Path, db_url: str, engines: tuple[LlamaServerStandIn, str, LlamaServerStandIn, str]
) -> None:
    """A gateway splits the traffic (deploy/gateway, ``draftwatch routes export``); a sidecar per pool only records.

    Half of each workload reaches the speculative pool's sidecar (``proxy.speculative = true``, no
    baseline of its own, so it never routes a second time) and half the baseline's
    (``proxy.speculative = baseline``): the loss is measured from the two, the scheduler's decision
    routes it, and the baseline's sidecar then names the holdouts of the routed workload ``route``.
    """
    _, spec_url, _, plain_url = engines
    env = {**DRIFT, "DRAFTWATCH_PROXY_ON_NET_LOSS": "route", "DRAFTWATCH_PROXY_ROUTE_REFRESH_S": "0.1"}
    with (
        sidecar(tmp_path, db_url, spec_url, DRAFTWATCH_PROXY_SPECULATIVE="true", **env) as (spec, spec_app),
        sidecar(tmp_path, db_url, plain_url, DRAFTWATCH_PROXY_SPECULATIVE="baseline", **env) as (plain, plain_app),
    ):
        # Both pools serve the model under one name, as a gateway's two backends do: one pair, compared.
        for url in (spec, plain):
            ask(url, {"qa": "What is the capital of France?"}, model="smollm2")
        flushed(spec_app)
        flushed(plain_app)
        engine = create_engine(db_url)
        try:
            settings = plain_app.state.api.settings
            run = run_drift(engine, settings.drift, datetime.now(UTC) + timedelta(seconds=1))
            verdict = verdict_of(next(r for r in run.results if r.test == "net_loss" and r.workload == "qa"))
            assert (verdict.verdict, verdict.measured) == ("net_loss", True), verdict
            assert verdict.speedup == pytest.approx(0.8, abs=0.03)
            switches = decide_routes(engine, settings.proxy, [verdict], datetime.now(UTC))
        finally:
            engine.dispose()
        assert [(s.workload, s.routed) for s in switches] == [("qa", True)]
        time.sleep(0.5)  # the baseline's sidecar reads the decision on its next refresh
        ask(plain, {"qa": "What is the capital of France?"}, model="smollm2")
        flushed(plain_app)
    plain_rows = [r for r in rows(db_url) if r["request_id"].startswith("chatcmpl-plain")]
    reasons = [r["holdout_reason"] for r in plain_rows]
    assert {r["mode"] for r in plain_rows} == {"holdout"}
    assert reasons == ["share"] * PER_WORKLOAD + ["route"] * PER_WORKLOAD
    spec_rows = [r for r in rows(db_url) if r["request_id"].startswith("chatcmpl-spec")]
    assert {(r["mode"], r["holdout_reason"]) for r in spec_rows} == {("speculative", None)}


def test_behind_a_gateway_the_candidate_s_own_sidecar_stores_its_answers_under_the_rollout_s_drafter(
    tmp_path: Path, db_url: str, engines: tuple[LlamaServerStandIn, str, LlamaServerStandIn, str]
) -> None:
    """The gateway sends a rollout's share to the candidate engine (routes export --candidate-service); its sidecar
    (``proxy.speculative = candidate``) stores every answer speculative under the rollout's drafter, that drafted
    or not, so that the judge finds the candidate's side; with no rollout running they are the current drafter's."""
    _, spec_url, _, _ = engines
    env = {"DRAFTWATCH_PROXY_SPECULATIVE": "candidate", "DRAFTWATCH_PROXY_ROUTE_REFRESH_S": "0.1",
           "DRAFTWATCH_ROLLOUT_DRAFTER": "ngram-next"}  # fmt: skip
    with sidecar(tmp_path, db_url, spec_url, **env) as (url, app):
        ask(url, {"before": "copy this"})
        # The rollout is started where the fleet's config names the candidate pool (the scheduler's pod).
        fleet = make_settings(tmp_path, db_url, DRAFTWATCH_PROXY_UPSTREAM="http://spec:8080",
                              DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM="http://cand:8080")  # fmt: skip
        engine = create_engine(db_url)
        try:
            start_rollout(engine, fleet.proxy, app.state.api.settings.rollout, datetime.now(UTC))
        finally:
            engine.dispose()
        deadline = time.monotonic() + 10
        while "*" not in app.state.api.router.rollouts and time.monotonic() < deadline:
            time.sleep(0.05)
        ask(url, {"copy": "copy this", "qa": "What is the capital of France?"})
        flushed(app)
    stored = {(r["workload"], r["mode"], r["drafter"]) for r in rows(db_url)}
    assert stored == {("before", "speculative", "upstream"), ("copy", "speculative", "ngram-next"),
                      ("qa", "speculative", "ngram-next")}  # fmt: skip
