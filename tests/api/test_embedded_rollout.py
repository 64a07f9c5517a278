"""A drafter rollout in the embedded decoder: smollm2-135m behind real HTTP, judged on the records it wrote.

The sidecar is the app ``draftwatch serve`` runs (``create_app`` on uvicorn, real HTTP, a SQLite
file), decoding with the decoder ``serve --target smollm2-135m CURRENT --candidate-drafter
CANDIDATE`` builds (:func:`decoder.cli.build_decoder`); its staging follows the store's rollout
(monitor/api/decoding/staging.py) every ``proxy.route_refresh_s``. The rollout is started as
``draftwatch rollout start`` starts it and judged by the scheduler's own :func:`advance_rollouts`,
called by the test with the wall clock's now once a step's requests are in.

The portfolio is the n-gram drafter; the candidate is the target as its own draft model
(``model:smollm2-135m``), which cannot pay: its controller arm, calibrated at start, decodes its
requests plain. Two workloads, as in tests/proxy/test_rollout_llama_server.py: ``copy`` (a list the
prompt repeats three times, continued: the n-gram drafter's drafts are all accepted, far faster
than plain) and ``story`` (chat requests for new text: the n-gram drafter finds little, about as
fast as plain). So the candidate fails copy (kept on the portfolio) and passes story (promoted
there): the per-workload rollout the embedded decoder is for. An n-gram candidate that is faster
than the portfolio on one workload and slower on another is what the llama-server test shows; in
the embedded decoder the controller switches a losing drafter to plain per workload, so a
candidate loses only where the portfolio gains, and wins only where it finds what the portfolio
does not. The judge is checked against the truth of the same run, the decode speeds the decoder
itself measured on the very requests (each side's mean ms per token), never against what the
machine was expected to do: its decode speed ratio must agree with the records'; a workload the
candidate ran clearly below the judge's floor (``1 - tolerance``, 0.75 here) must fail, one clearly
above it must pass, and in the tie zone between either word (or a step held on) is the judge's
(tests/rollout_truth.py). Whichever way the judge went, once it moved the rollout each workload is
served as the stored rollout says (the candidate where it passed, the portfolio where it was kept)
and the abort ends it; only a run where nothing was decided at all skips that, with the ratios said.

Settings lowered so that the test takes about a minute on 2 cores: ``rollout.min_requests`` 10,
``rollout.interval`` 1 s, ``rollout.max_holds`` high (a held step goes on collecting), and
``rollout.tolerance`` 0.25 as in tests/proxy/test_rollout_llama_server.py: time to first token is
judged too, and here it is the same prompt read on both sides, 10 a side. No holdout (target 0):
it is drawn apart from the candidate (tests/decoder/test_candidate.py) and would only cost time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import Engine

from decoder.candidate import parse_candidate
from decoder.cli import add_model_arguments, build_decoder
from decoder.record import decode_ms_per_token
from decoder.speculation.speculative import SpeculativeDecoder
from monitor.api.app import create_app
from monitor.config import Settings
from monitor.proxy.rollout import abort, advance_rollouts, start_rollout
from monitor.store.engine import create_engine
from monitor.store.rollouts import Rollout, RolloutEvent, get_rollout, rollout_events
from tests import rollout_truth as truth
from tests.api.conftest import make_settings
from tests.rollout_prompts import PROMPTS
from tests.serving import serving

pytestmark = pytest.mark.models

CURRENT = ("--drafter", "ngram")
# The target as its own draft model: every draft costs a target pass, so the controller decodes its
# requests plain (but for a probe now and then). On story that is as fast as the n-gram drafter,
# which finds little to copy there; on copy the n-gram drafter is far faster.
CANDIDATE = "model:smollm2-135m"
NAME = "self-draft"
PASSES, FAILS = "story", "copy"
# The records' ratios measured: copy 0.24x (clearly below the floor of 1 - tolerance = 0.75), story 0.90x once (the
# candidate's probes cost it a little), near the pass band's 0.88x (tests/rollout_truth.py's Bands).
MAX_NEW_TOKENS = 32
MIN_REQUESTS = 10
ENV = {
    "DRAFTWATCH_API_TOKENS": "",
    "DRAFTWATCH_PROXY_ROUTE_REFRESH_S": "0.2",
    "DRAFTWATCH_DECODER_HOLDOUT_TARGET": "0",
    "DRAFTWATCH_DECODER_CANDIDATE": CANDIDATE,
    "DRAFTWATCH_ROLLOUT_DRAFTER": NAME,
    "DRAFTWATCH_ROLLOUT_STEPS": "50,100",
    "DRAFTWATCH_ROLLOUT_INTERVAL": "1s",
    "DRAFTWATCH_ROLLOUT_MIN_REQUESTS": str(MIN_REQUESTS),
    "DRAFTWATCH_ROLLOUT_MAX_HOLDS": "100000",
    "DRAFTWATCH_ROLLOUT_TOLERANCE": "0.25",
    "DRAFTWATCH_ROLLOUT_PER_WORKLOAD": "true",
}


@pytest.fixture(scope="module")
def decoder() -> SpeculativeDecoder:
    """What ``draftwatch serve --target smollm2-135m CURRENT --candidate-drafter CANDIDATE`` decodes with."""
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    args = parser.parse_args(["--target", "smollm2-135m", *CURRENT])
    return build_decoder(args, progress=False, candidate=parse_candidate(CANDIDATE))


@dataclass
class Sidecar:
    app: FastAPI
    client: httpx.Client
    engine: Engine
    settings: Settings
    decoder: SpeculativeDecoder
    sent: Counter[str]

    def ask(self, workload: str) -> dict[str, Any]:
        """One request of ``workload`` (the copy a plain completion, the story a chat); its record."""
        prompts = PROMPTS[workload]
        body = {"prompt": prompts[self.sent[workload] % len(prompts)], "chat": workload != "copy",
                "workload": workload, "max_new_tokens": MAX_NEW_TOKENS}  # fmt: skip
        self.sent[workload] += 1
        response = self.client.post("/v1/generate", json=body)
        assert response.status_code == 200, response.text
        record: dict[str, Any] = response.json()["record"]
        return record

    def staged(self, served: Callable[[Rollout | None], bool], what: str) -> None:
        """Wait until the decoder's staging (the follower's last read of the store) is ``what``."""
        deadline = time.monotonic() + 10
        while not served(self.rollout()):
            assert time.monotonic() < deadline, f"the decoder did not take {what}: it stages {self.rollout()}"
            time.sleep(0.05)

    def rollout(self) -> Rollout | None:
        staging = self.decoder.staging
        assert staging is None or isinstance(staging, Rollout)
        return staging

    def fill(self, workload: str, records: list[dict[str, Any]], need: int) -> list[dict[str, Any]]:
        """``workload``'s requests, one at a time, until each side the rollout sends it to has served ``need``."""
        rollout = self.rollout()
        share = rollout.share(workload) if rollout is not None else 0.0
        wanted = ["candidate"] if share == 1.0 else ["current"] if share == 0.0 else ["candidate", "current"]
        # A side short past this many requests is an error once in 10^5 calls; a test makes at most 6 (3 needs, 2
        # workloads): under 10^-4 a test.
        bound = truth.fill_bound(need, share, 1e-5)
        records = list(records)
        while (missing := max(need - Counter(map(side, records))[s] for s in wanted)) > 0:
            assert len(records) < bound, f"{workload} at share {share:g}: {Counter(map(side, records))}"
            records += [self.ask(workload) for _ in range(missing)]
        return records

    def advance(self) -> list[RolloutEvent]:
        """The scheduler's rollout job, now, once every record so far is stored."""
        assert self.app.state.api.recorder.flush(10)
        return advance_rollouts(self.engine, self.settings.rollout, datetime.now(UTC))


def side(record: dict[str, Any]) -> str:
    assert record["mode"] != "holdout", record
    return "candidate" if record["drafter"] == NAME else "current"


def speeds(records: list[dict[str, Any]]) -> dict[str, float]:
    """Mean decode ms per output token of each side's requests (the judge's metric, unstratified)."""
    per_side: dict[str, list[float]] = {}
    for r in records:
        ms = decode_ms_per_token(r["latency_ms"], r["ttft_ms"], r["output_tokens"], r["decode_ms"])
        if ms is not None:
            per_side.setdefault(side(r), []).append(ms)
    return {s: round(statistics.mean(values), 2) for s, values in sorted(per_side.items())}


@pytest.fixture
def sidecar(tmp_path: Path, decoder: SpeculativeDecoder) -> Iterator[Sidecar]:
    db_url = f"sqlite:///{tmp_path / 'draftwatch.db'}"
    settings = make_settings(tmp_path, db_url, **ENV)
    app = create_app(settings, decoder=decoder)
    engine = create_engine(db_url)
    try:
        with serving(app) as url, httpx.Client(base_url=url, timeout=120) as client:
            yield Sidecar(app, client, engine, settings, decoder, Counter())
    finally:
        decoder.staging = None
        engine.dispose()


def test_per_workload_the_candidate_drafter_takes_story_and_copy_stays_on_the_portfolio(sidecar: Sidecar) -> None:
    started = time.monotonic()
    before = [sidecar.ask(PASSES) for _ in range(2)] + [sidecar.ask(FAILS) for _ in range(2)]
    assert {side(r) for r in before} == {"current"}  # no rollout: the candidate serves nothing
    settings = sidecar.settings
    rollout = start_rollout(sidecar.engine, settings.proxy, settings.rollout, datetime.now(UTC),
                            embedded=settings.decoder.candidate)  # fmt: skip
    assert rollout.id is not None and rollout.current_drafters == ("model", "ngram")
    sidecar.staged(lambda r: r is not None and r.id == rollout.id, "the rollout's first step")

    # Step 1 (50 %), the last below 100 %: copy fails and is kept on the portfolio, story passes.
    records: dict[str, list[dict[str, Any]]] = {PASSES: [], FAILS: []}
    events: list[RolloutEvent] = []
    for need in (MIN_REQUESTS, MIN_REQUESTS * 3 // 2, MIN_REQUESTS * 2):
        now = get_rollout(sidecar.engine, rollout.id)
        assert now is not None
        for workload in (PASSES, FAILS):
            if workload not in now.workloads:
                records[workload] = sidecar.fill(workload, records[workload], need)
        events += sidecar.advance()
        done = get_rollout(sidecar.engine, rollout.id)
        if done is None or done.status != "running":
            break
    assert done is not None
    measured = {w: speeds(given) for w, given in records.items()}
    print(f"\n  decode ms per token: {measured}; events: {[(e.kind, e.workload, e.reason) for e in events]}")
    # The judge against the records' own ratios, never against what this machine was expected to do.
    words = truth.judged_words(events, done.judgement)
    truths = {w: truth.truth_of(ms, w) for w, ms in measured.items()}  # each side served at least min_requests of both
    calls = truth.check_judge(
        truths, words, truth.Bands.of(settings.rollout.tolerance), context=[e.reason for e in events]
    )
    if not truth.decided(done):
        pytest.skip(f"the judge held the step on {words} (measured {truths}, called {calls}): nothing to serve by")
    if calls == {PASSES: "pass", FAILS: "fail"}:  # the scenario: copy kept on the portfolio, story promoted
        assert [(e.kind, e.workload) for e in events if e.kind != "held"] == [("kept", FAILS), ("promoted", None)]
        assert done.status == "promoted" and dict(done.workloads) == {PASSES: "candidate", FAILS: "current"}
        judged = events[-1].judgement["workloads"][PASSES]
        assert judged["outcome"] == "pass" and judged["n_candidate"] >= MIN_REQUESTS, judged
    kinds = [e.kind for e in rollout_events(sidecar.engine, rollout_id=rollout.id)]
    assert kinds == ["started", *(e.kind for e in events)], kinds

    # Whichever way the judge went: the decoder serves each workload as the stored rollout says (promoted on story,
    # every story request the candidate's and every copy one the portfolio's).
    expected = truth.expected_sides(done, words, (PASSES, FAILS))
    print(f"  {done.status}, workloads {dict(done.workloads)}: served by {expected}")
    sidecar.staged(lambda r: truth.routes_as(r, done), f"the rollout {done.status}")
    after = {w: [side(sidecar.ask(w)) for _ in range(3)] for w, s in expected.items() if s is not None}
    assert after == {w: [s] * 3 for w, s in expected.items() if s is not None}, (after, done)

    # Ended (draftwatch rollout abort, where it is still running or promoted): every request is the portfolio's again.
    if done.active:
        abort(sidecar.engine, rollout.id, datetime.now(UTC))
    sidecar.staged(lambda r: r is None, "the end of the rollout")
    assert [side(sidecar.ask(w)) for w in (PASSES, FAILS) for _ in range(2)] == ["current"] * 4
    print(f"  {time.monotonic() - started:.1f} s")
