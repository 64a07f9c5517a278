"""The LiteLLM gate and a drafter rollout: read from a real draftwatch's API, its share sent to the candidate
deployment, the candidate's answers reported under the rollout's drafter name where the judge reads them.

draftwatch's API runs on real HTTP (uvicorn, as ``draftwatch serve`` runs it) over a SQLite file;
the rollouts are started, changed and ended on that file by ``monitor.proxy.rollout`` and
``monitor.store.rollouts``, as the CLI, the API and the scheduler's judge do. The reports are a real
llama-server's answer (tests/fixtures/stacks), posted by the integration's own reporter. No LiteLLM
here: tests/deploy/test_litellm.py runs the same gate inside a real LiteLLM proxy.
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import pytest
from sqlalchemy.engine import Engine

from decoder.candidate import Candidate
from monitor.api.app import create_app
from monitor.gateways import litellm_gate
from monitor.gateways.litellm_gate import Gate, Staged
from monitor.gateways.litellm_link import client
from monitor.gateways.litellm_report import Reporter, report_body
from monitor.gateways.litellm_settings import LitellmSettings, load_settings
from monitor.proxy.rollout import abort, deployment_of, promote, start_rollout
from monitor.proxy.settings import ProxySettings, RolloutSettings
from monitor.settings.parsers import ConfigError
from monitor.store import rollouts
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.rollouts import CURRENT_DRAFTER, STATUSES, Rollout, Status, save_rollout
from monitor.store.routing import RoutingEvent, load_reason, record_switch
from tests.api.conftest import ADMIN, make_settings
from tests.draws import assert_share
from tests.proxy.engine import rows
from tests.proxy.upstream import fixture
from tests.serving import serving

CANDIDATE: Final = "ngram-m16"
# The configuration `draftwatch rollout start` checks: the default deployment has a candidate pool.
PROXY: Final = ProxySettings(upstream=("http://smol:8080",), candidate_upstream=("http://smol-next:8080",))
STEPS: Final = RolloutSettings(steps=(0.5, 1.0), drafter=CANDIDATE, per_workload=True)
ANSWER: Final = fixture("llamacpp", "real-b11434-chat-draft")["response"]
DRAWS: Final = 400
# The embedded decoder's candidate drafter (decoder.candidate): its rollouts are on the default deployment too.
EMBEDDED: Final = Candidate("ngram", ngram_min=1, ngram_max=4)


def test_the_gate_spells_the_store_s_names_as_the_store_does() -> None:
    assert litellm_gate.CURRENT_DRAFTER == rollouts.CURRENT_DRAFTER
    assert litellm_gate.ACTIVE == rollouts.ACTIVE
    assert deployment_of(PROXY, None).deployment == litellm_gate.DEFAULT_DEPLOYMENT


@pytest.mark.parametrize("current", [(CURRENT_DRAFTER,), ("model", "ngram"), ("ngram",)])
def test_the_gate_tells_a_proxy_s_rollout_as_the_store_does(current: tuple[str, ...]) -> None:
    t = datetime(2026, 3, 1, tzinfo=UTC)
    stored = Rollout("*", CANDIDATE, (0.5, 1.0), 600.0, False, t, t, current_drafters=current, id=3)
    assert litellm_gate.of_proxy(stored.to_json()) == stored.of_proxy


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("per_workload", [False, True])
def test_each_workload_s_share_read_from_the_api_is_the_one_the_sidecar_applies(
    status: Status, per_workload: bool
) -> None:
    t = datetime(2026, 3, 1, tzinfo=UTC)
    stored = Rollout("*", CANDIDATE, (0.05, 0.25, 1.0), 600.0, per_workload, t, t, status=status, step=1,
                     workloads={"copy": "candidate", "story": "current"}, id=3)  # fmt: skip
    staged = Staged.from_json(stored.to_json())
    for workload in ("copy", "story", "chat"):
        assert staged.share(workload) == stored.share(workload), workload


def test_each_litellm_replica_draws_the_candidates_share_of_its_own() -> None:
    """Replicas of the LiteLLM proxy (and a restarted one) must not send the same positions of their traffic."""
    settings = load_settings({
        "DRAFTWATCH_LITELLM_URL": "http://d", "DRAFTWATCH_LITELLM_DEPLOYMENTS": "smol=smol-plain",
        "DRAFTWATCH_LITELLM_CANDIDATES": "smol=smol-next",
        "DRAFTWATCH_LITELLM_HOLDOUT_SHARE": "0", "DRAFTWATCH_LITELLM_HOLDOUT_MAX_SHARE": "0",
    })  # fmt: skip
    drawn = []
    for gate in (Gate(settings), Gate(settings)):
        gate.rollout = Staged(3, CANDIDATE, "running", 0.5, False, {})
        drawn.append([gate.choose("smol", "chat")[0] == "smol-next" for _ in range(2000)])
    assert drawn[0] != drawn[1]  # equal everywhere with probability 2**-2000
    for sequence in drawn:
        assert_share(sequence, 0.5)


@dataclass
class Draftwatch:
    url: str
    db_url: str
    engine: Engine

    def settings(self) -> LitellmSettings:
        return load_settings({
            "DRAFTWATCH_LITELLM_URL": self.url, "DRAFTWATCH_LITELLM_TOKEN": ADMIN,
            "DRAFTWATCH_LITELLM_DEPLOYMENTS": "smol=smol-plain", "DRAFTWATCH_LITELLM_CANDIDATES": "smol=smol-next",
            "DRAFTWATCH_LITELLM_HOLDOUT_SHARE": "0", "DRAFTWATCH_LITELLM_HOLDOUT_MAX_SHARE": "0",
        })  # fmt: skip


@pytest.fixture
def draftwatch(tmp_path: Path) -> Iterator[Draftwatch]:
    db_url = f"sqlite:///{tmp_path / 'draftwatch.db'}"
    engine = create_engine(db_url)
    upgrade(engine)
    try:
        with serving(create_app(make_settings(tmp_path, db_url))) as url:
            yield Draftwatch(url, db_url, engine)
    finally:
        engine.dispose()


def refreshed(gate: Gate, until: Callable[[Gate], bool]) -> None:
    """Run the gate's refresh against draftwatch (every 0.05 s) until ``until(gate)`` holds, 10 s at most."""

    async def run() -> None:
        async with client(gate.settings) as http:
            task = asyncio.create_task(gate.refresh(http, 0.05))
            try:
                async with asyncio.timeout(10):
                    while not until(gate):
                        await asyncio.sleep(0.02)
            finally:
                task.cancel()

    asyncio.run(run())


def picks(gate: Gate, workload: str) -> Counter[str]:
    """Where ``DRAWS`` requests of ``workload`` for ``smol`` go; a candidate's pick names the rollout's drafter."""
    chosen = [gate.choose("smol", workload) for _ in range(DRAWS)]
    assert all(drafter == (CANDIDATE if model == "smol-next" else None) for model, _, drafter in chosen)
    return Counter(model for model, _, _ in chosen)


def test_the_active_rollout_s_share_goes_to_the_candidate_per_workload_until_it_ends(draftwatch: Draftwatch) -> None:
    gate = Gate(draftwatch.settings())
    assert picks(gate, "chat") == {"smol": DRAWS}  # no rollout read yet: nothing to the candidate
    r = start_rollout(draftwatch.engine, PROXY, STEPS, datetime.now(UTC))
    assert r.id is not None
    refreshed(gate, lambda g: g.rollout is not None)
    assert gate.rollout == Staged(r.id, CANDIDATE, "running", 0.5, True, {})
    # Half of the speculative requests, drawn (binomial: 200 +- 10 a standard deviation).
    assert 160 <= picks(gate, "chat")["smol-next"] <= 240

    with draftwatch.engine.begin() as conn:  # the judge kept story on the current drafter
        save_rollout(conn, replace(r, workloads={"story": "current"}))
    refreshed(gate, lambda g: g.rollout is not None and "story" in g.rollout.workloads)
    assert picks(gate, "story") == {"smol": DRAWS}
    assert 160 <= picks(gate, "chat")["smol-next"] <= 240

    promote(draftwatch.engine, r.id, datetime.now(UTC))
    refreshed(gate, lambda g: g.rollout is not None and g.rollout.status == "promoted")
    assert picks(gate, "chat") == {"smol-next": DRAWS} and picks(gate, "story") == {"smol": DRAWS}

    abort(draftwatch.engine, r.id, datetime.now(UTC))
    refreshed(gate, lambda g: g.rollout is None)
    assert picks(gate, "chat") == {"smol": DRAWS}


def test_the_embedded_decoder_s_rollout_of_the_default_deployment_is_not_the_gate_s(draftwatch: Draftwatch) -> None:
    """Its current side is the embedded portfolio: the gate's candidate deployment is no part of it."""
    gate = Gate(draftwatch.settings())
    r = start_rollout(draftwatch.engine, PROXY, STEPS, datetime.now(UTC))
    assert r.id is not None
    refreshed(gate, lambda g: g.rollout is not None)
    abort(draftwatch.engine, r.id, datetime.now(UTC))
    embedded = start_rollout(draftwatch.engine, ProxySettings(), STEPS, datetime.now(UTC), embedded=EMBEDDED)
    assert embedded.deployment == "*" and not embedded.of_proxy
    refreshed(gate, lambda g: g.rollout is None or g.rollout.id != r.id)
    assert gate.rollout is None
    assert picks(gate, "chat") == {"smol": DRAWS}


def answer(request_id: str) -> dict[str, Any]:
    reply: dict[str, Any] = copy.deepcopy(ANSWER)
    reply["id"] = request_id
    return reply


def test_the_candidate_s_answers_are_reported_under_the_rollout_s_drafter_the_others_under_the_current_one(
    draftwatch: Draftwatch,
) -> None:
    gate = Gate(draftwatch.settings())
    started = datetime.now(UTC) - timedelta(seconds=1)
    r = start_rollout(draftwatch.engine, PROXY, STEPS, started)
    refreshed(gate, lambda g: g.rollout is not None)
    reporter = Reporter(gate.settings.stack, 1000)
    sent: dict[str, str | None] = {}
    for i in range(60):
        model, diverted, drafter = gate.choose("smol", "copy")
        declared = gate.declared(model, diverted, drafter)
        assert declared is not None
        mode, drafter_name = declared
        now = datetime.now(UTC).timestamp()
        reporter.offer(report_body(answer(f"a{i}"), workload="copy", mode=mode, drafter=drafter_name,
                                   started=now - 0.5, ended=now))  # fmt: skip
        sent[f"a{i}"] = drafter

    async def post() -> None:
        async with client(gate.settings) as http:
            task = asyncio.create_task(reporter.run(http))
            try:
                async with asyncio.timeout(30):
                    while len([row for row in rows(draftwatch.db_url) if row["request_id"] in sent]) < len(sent):
                        await asyncio.sleep(0.1)
            finally:
                task.cancel()

    asyncio.run(post())
    stored = {row["request_id"]: row for row in rows(draftwatch.db_url)}
    for request_id, drafter in sent.items():
        row = stored[request_id]
        assert (row["drafter"], row["mode"], row["mode_inferred"]) == (drafter or CURRENT_DRAFTER, "speculative", False)
    # Both sides of the step, as the judge reads them: one target and draft model, two drafter names.
    assert {(row["target_model"], row["draft_model"]) for row in stored.values()} == {("smollm2-135m", None)}
    assert 0 < sum(1 for drafter in sent.values() if drafter == r.drafter) < len(sent)


def test_a_candidate_name_outside_the_pairs_or_taken_is_refused_naming_the_variable() -> None:
    base = {"DRAFTWATCH_LITELLM_URL": "http://d", "DRAFTWATCH_LITELLM_DEPLOYMENTS": "a=a-plain,b=b-plain"}
    for candidates in ("c=c-next", "a=b-plain", "a=b"):
        with pytest.raises(ConfigError, match=f"^DRAFTWATCH_LITELLM_CANDIDATES: {candidates}: expected the "):
            load_settings({**base, "DRAFTWATCH_LITELLM_CANDIDATES": candidates})
    settings = load_settings({**base, "DRAFTWATCH_LITELLM_CANDIDATES": "a=a-next, b=b-next"})
    assert settings.candidates == (("a", "a-next"), ("b", "b-next"))


def test_a_workload_routed_by_load_stays_on_the_speculative_deployment_whose_sidecar_routes_it(
    draftwatch: Draftwatch,
) -> None:
    t = datetime.now(UTC)
    with draftwatch.engine.begin() as conn:
        record_switch(conn, RoutingEvent(t, "qa", "smol", True, "net loss", 0.6, 0.5, 0.7))
        record_switch(
            conn, RoutingEvent(t, "chat", "smol", True, load_reason(4, "loses from 4"), 0.9, 0.8, 1.0, above_inflight=4)
        )
    gate = Gate(draftwatch.settings())
    refreshed(gate, lambda g: bool(g.routed))
    assert gate.routed == {"qa"}
