"""A drafter rollout against real llama-servers: the judge per workload on llama.cpp's own timings.

Three llama-servers serve smollm2-135m, one core each (``--threads 1``), behind a real draftwatch
proxy on real HTTP: **plain** (``--baseline-upstream``, no speculation), **current**
(``--upstream``, a conservative n-gram drafter: the 2 tokens that followed the last occurrence of
the last 2, n = 2, m = 2) and **candidate** (``--candidate-upstream``, a greedy one: after any
token seen before, the 16 that followed it, n = 1, m = 16). The rollout stores the candidate's
requests under ``ngram-greedy``, the current pool's under ``upstream``.

Two workloads, chosen so that the candidate wins one and loses the other:

* ``copy``: a completion that continues a list of 40 distinct one-token words the prompt repeats
  three times. smollm2-135m copies it token for token (asked to "copy the list exactly" it repeats
  one word instead), and every token's last occurrence is followed by the right ones: the
  candidate's drafts are all accepted, 17 tokens a verification against the current drafter's 3.
  Measured (5 runs, 2 cores shared with other work, load average 2.4-5.5): current 11.1-17.8 ms
  a token, candidate 7.1-12.1, plain 11.8-16.9: the candidate 1.46-1.66x the current drafter.
* ``story``: chat requests for new text. The greedy drafter drafts 16 tokens after every repeated
  token (" the", ",") and accepts 4-5 % of them: candidate 29-48 ms a token against the current
  drafter's 12.4-15.6 (0.32-0.43x), which drafts 2 tokens only after a repeated pair.

Settings tried first: the current drafter n = 3, m = 2 drafts nothing at all (llama.cpp b11434's
ngram-simple returns no draft when m < n: ``copy_max < n_draft_min`` in common/ngram-map.cpp);
n = 3, m = 3 against a candidate of n = 1, m = 8 gave the candidate only 1.12-1.19x on copy on an
idle machine and 0.95-1.06x under load, too thin a win to hold. Story was never in doubt.

Which server answered is read from the stored records (drafter ``ngram-greedy`` or ``upstream``,
mode ``holdout`` for plain) and, after the promotion, from each server's own
``llamacpp:tokens_predicted_total`` (``/metrics``). The judge is checked against the truth of the
same run, never against what the machine was expected to do: llama.cpp's own
``timings.predicted_per_token_ms`` of the very answers gives the candidate's true ratio per workload
(current ms per token over the candidate's). The judge's decode speed must agree with it; a workload
llama.cpp itself ran clearly below the judge's floor (``1 - tolerance``, 0.75 here) must fail, one
clearly above it must pass, and in the tie zone between either word (or a step held on) is the
judge's (tests/rollout_truth.py). Whichever way the judge went, once it moved the rollout the proxy
routes each workload as the stored rollout says (the candidate where it passed, the current drafter
where it was kept or rolled back), and what a test adds for its scenario (the candidate winning
copy, losing story) is checked where llama.cpp's ratios gave it; only a step where nothing was
decided at all skips the rest, with llama.cpp's ratios said.

Settings lowered so that a run takes 70-90 s on 2 cores: ``rollout.min_requests`` 10 (30),
``rollout.interval`` 1 s and ``advance_rollouts`` called by the test with the wall clock's now once
a step's requests are in, ``rollout.max_holds`` high (a step that holds goes on collecting instead
of giving up after 3 one-second intervals), ``rollout.tolerance`` 0.25 (0.05): time to first token
is judged too, and here it is one token's prompt read (~20 ms, 30-40 % spread under load; equal on
both sides), which at 10 a side would read below 0.95x about a third of the time and hold the step;
the decode speeds are far from 0.75x either way. Before a workload's requests each server reads
its prompt once, straight (:meth:`Sidecar.warm`), so that no side's time to first token carries a
cold prompt read that the other's does not. The plain baseline gets a holdout target of 2 per
workload (share 0.5), just enough to print its speed. Requests go one at a time, so every server
runs at the same load.

Passing the last step below 100 % promotes the candidate: at 100 % the current drafter would have
none of the workload's requests to judge it against (a first version held that step for ever; these
tests found it).
"""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select
from sqlalchemy.engine import Engine

from decoder.models.fetch import fetch_preset
from monitor.api.app import create_app
from monitor.config import Settings
from monitor.proxy.rollout import advance_rollouts, start_rollout
from monitor.store.engine import create_engine
from monitor.store.models import RequestRow
from monitor.store.rollouts import CURRENT_DRAFTER, Rollout, RolloutEvent, get_rollout, rollout_events
from tests import rollout_truth as truth
from tests.api.conftest import make_settings
from tests.rollout_prompts import PROMPTS
from tests.serving import serving
from tests.stacks.llama_server import BASE_ARGS, LlamaServer, llama_server, require_binary

pytestmark = pytest.mark.models

CANDIDATE = "ngram-greedy"


def ngram(n: int, m: int) -> tuple[str, ...]:
    return ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(n), "--spec-ngram-simple-size-m", str(m))


# One core each, so that the servers do not take turns on the same cores; /metrics to count each one's tokens.
ONE_CORE = ("--threads", "1", "--metrics")
CURRENT_NGRAM = ngram(2, 2)
CANDIDATE_NGRAM = ngram(1, 16)
MAX_TOKENS = 32
MIN_REQUESTS = 10
# llama.cpp's own ratios measured: story 0.32-0.47x, copy 1.24-1.66x, against the floor of 1 - tolerance = 0.75 and
# tests/rollout_truth.py's bands around it (0.5x and 0.88x; at 10 a side on a loaded machine the judge's interval
# top reached 1.42x the estimate).
ENV = {
    "DRAFTWATCH_API_TOKENS": "",
    "DRAFTWATCH_PROXY_ROUTE_REFRESH_S": "0.2",
    "DRAFTWATCH_DECODER_HOLDOUT_SHARE": "0",
    "DRAFTWATCH_DECODER_HOLDOUT_TARGET": "2",
    "DRAFTWATCH_DECODER_HOLDOUT_MAX_SHARE": "0.5",
    "DRAFTWATCH_ROLLOUT_DRAFTER": CANDIDATE,
    "DRAFTWATCH_ROLLOUT_STEPS": "50,100",
    "DRAFTWATCH_ROLLOUT_INTERVAL": "1s",
    "DRAFTWATCH_ROLLOUT_MIN_REQUESTS": str(MIN_REQUESTS),
    "DRAFTWATCH_ROLLOUT_MAX_HOLDS": "100000",
    "DRAFTWATCH_ROLLOUT_TOLERANCE": "0.25",
}
SIDES = ("plain", "current", "candidate")
HOLDOUT_TARGET = int(ENV["DRAFTWATCH_DECODER_HOLDOUT_TARGET"])


@dataclass(frozen=True)
class Servers:
    plain: LlamaServer
    current: LlamaServer
    candidate: LlamaServer

    def predicted(self) -> dict[str, int]:
        """Each server's ``llamacpp:tokens_predicted_total``: the tokens of every answer it gave."""
        totals = {}
        for side in SIDES:
            text = httpx.get(f"{getattr(self, side).url}/metrics", timeout=10).text
            found = re.search(r"^llamacpp:tokens_predicted_total (\S+)$", text, re.M)
            assert found, text[:500]
            totals[side] = int(float(found.group(1)))
        return totals


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    binary = require_binary()
    model = fetch_preset("smollm2-135m", progress=False)
    with (
        llama_server(model, *BASE_ARGS, *ONE_CORE, binary=binary) as plain,
        llama_server(model, *BASE_ARGS, *CURRENT_NGRAM, *ONE_CORE, binary=binary) as current,
        llama_server(model, *BASE_ARGS, *CANDIDATE_NGRAM, *ONE_CORE, binary=binary) as candidate,
    ):
        yield Servers(plain, current, candidate)


@pytest.fixture
def clock(request: pytest.FixtureRequest) -> Iterator[None]:
    start = time.monotonic()
    yield
    print(f"\n[{request.node.name}] {time.monotonic() - start:.1f} s")


@dataclass
class Sidecar:
    """A draftwatch proxy on real HTTP, and the test's own engine on its database (the scheduler's part)."""

    app: FastAPI
    url: str
    client: httpx.Client
    engine: Engine
    settings: Settings
    servers: tuple[LlamaServer, ...]
    sent: Counter[str] = field(default_factory=Counter)

    def ask(self, workload: str) -> dict[str, Any]:
        prompts = PROMPTS[workload]
        prompt = prompts[self.sent[workload] % len(prompts)]
        self.sent[workload] += 1
        # The copy is a plain completion: a chat template's reply would not continue the list.
        body: dict[str, Any] = {"max_tokens": MAX_TOKENS, "temperature": 0}
        if workload == "copy":
            path, body["prompt"] = "/v1/completions", prompt
        else:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
        response = self.client.post(f"{self.url}{path}", json=body, headers={"X-Workload": workload})
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    def sides(self, answers: list[dict[str, Any]]) -> list[str]:
        """Which server answered each of ``answers``, from its stored record."""
        assert self.app.state.api.recorder.flush(10)
        ids = [a["id"] for a in answers]
        r = RequestRow
        with self.engine.connect() as conn:
            found = {row.request_id: row for row in conn.execute(
                select(r.request_id, r.drafter, r.mode).where(r.request_id.in_(ids)))}  # fmt: skip
        assert len(found) == len(set(ids)), f"{len(set(ids)) - len(found)} answers have no record"
        return [_side(found[i].drafter, found[i].mode) for i in ids]

    def serving_rollout(self) -> Rollout | None:
        """The rollout this sidecar routes by (what its last refresh read)."""
        rollout: Rollout | None = self.app.state.api.router.rollouts.get("*")
        return rollout

    def await_rollout(self, served: Callable[[Rollout | None], bool], what: str) -> None:
        deadline = time.monotonic() + 10
        while not served(self.serving_rollout()):
            assert time.monotonic() < deadline, f"the proxy did not take {what}: it routes by {self.serving_rollout()}"
            time.sleep(0.05)

    def fill(self, workload: str, answers: list[dict[str, Any]], need: int) -> list[dict[str, Any]]:
        """``workload``'s requests, one at a time, until each pool the rollout sends it to has answered ``need``."""
        rollout = self.serving_rollout()
        share = rollout.share(workload) if rollout is not None else 0.0
        wanted = ["candidate"] if share == 1.0 else ["current"] if share == 0.0 else ["candidate", "current"]
        self.warm(workload)
        answers = list(answers)
        while True:
            counts = Counter(self.sides(answers))
            missing = max(need - counts[side] for side in wanted)
            if missing <= 0:
                return answers
            # Past this many requests a pool is short in error once in 10^5 calls (the holdout's few plain requests
            # counted in); a test makes at most 6 (3 needs, 2 workloads, or 2 steps of 1): under 10^-4 a test.
            bound = truth.fill_bound(need, share, 1e-5)
            assert len(answers) < bound, f"{workload} at share {share:g}: answered by {dict(counts)}"
            answers += [self.ask(workload) for _ in range(missing)]

    def warm(self, workload: str) -> None:
        """Each server reads ``workload``'s prompt (one token of answer), straight, not through the proxy.

        Time to first token is judged, and a server's first request of a workload reads its whole
        prompt (a second for the copy's) where the next ones read a token or two from the cache: one
        such outlier on one side only swings the comparison. Warmed, both sides start alike.
        """
        prompt = PROMPTS[workload][self.sent[workload] % len(PROMPTS[workload])]
        body: dict[str, Any] = {"max_tokens": 1, "temperature": 0}
        if workload == "copy":
            path, body["prompt"] = "/v1/completions", prompt
        else:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
        for server in self.servers:
            assert self.client.post(f"{server.url}{path}", json=body).status_code == 200

    def advance(self) -> list[RolloutEvent]:
        """The scheduler's rollout job, now: every answer so far is stored first."""
        assert self.app.state.api.recorder.flush(10)
        return advance_rollouts(self.engine, self.settings.rollout, datetime.now(UTC))


def _side(drafter: str, mode: str) -> str:
    if mode == "holdout":
        return "plain"
    assert mode == "speculative", mode
    return {CANDIDATE: "candidate", CURRENT_DRAFTER: "current"}[drafter]


@contextmanager
def sidecar(tmp_path: Path, servers: Servers, **env: str) -> Iterator[Sidecar]:
    """The proxy in front of the three servers, on ``tmp_path``'s database, ``env`` on top of :data:`ENV`."""
    db_url = f"sqlite:///{tmp_path / 'draftwatch.db'}"
    pools = {
        "DRAFTWATCH_PROXY_UPSTREAM": servers.current.url,
        "DRAFTWATCH_PROXY_BASELINE_UPSTREAM": servers.plain.url,
        "DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM": servers.candidate.url,
    }
    settings = make_settings(tmp_path, db_url, **{**ENV, **pools, **env})
    app = create_app(settings)
    engine = create_engine(db_url)
    try:
        with serving(app) as url, httpx.Client(timeout=120) as client:
            yield Sidecar(app, url, client, engine, settings, (servers.plain, servers.current, servers.candidate))
    finally:
        engine.dispose()


def speeds(proxy: Sidecar, answers: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per workload and server, llama.cpp's mean ``predicted_per_token_ms`` of the answers it gave."""
    found: dict[str, dict[str, float]] = {}
    for workload, given in answers.items():
        per_side: dict[str, list[float]] = {side: [] for side in SIDES}
        for answer, side in zip(given, proxy.sides(given), strict=True):
            per_side[side].append(answer["timings"]["predicted_per_token_ms"])
        found[workload] = {side: round(statistics.mean(ms), 2) for side, ms in per_side.items() if ms}
        print(f"  {workload}: ms/token " + ", ".join(f"{side} {ms} (n={len(per_side[side])})"
                                                     for side, ms in found[workload].items()))  # fmt: skip
    return found


def scores(events: list[RolloutEvent]) -> None:
    """Print each event and the judge's view of every workload it judged."""
    for event in events:
        print(f"  event {event.kind} (step {event.step + 1}, share {event.share:g}): {event.reason}")
    if not events:
        return
    for workload, j in events[-1].judgement.get("workloads", {}).items():
        metrics = "; ".join(
            f"{m['metric']} {m['outcome'] or 'shown'} "
            + (f"{m['ratio']:.2f}x [{m['ci'][0]:.2f}, {m['ci'][1]:.2f}]" if m.get("ci") else
               f"candidate {m['candidate']:.3g} current {m['current']:.3g}")
            for m in j["metrics"]
        )  # fmt: skip
        print(f"  judge {workload}: {j['outcome']} score {j['score']} "
              f"(n {j['n_candidate']}/{j['n_current']}): {metrics}")  # fmt: skip


def check(proxy: Sidecar, step: Step, workloads: tuple[str, ...]) -> dict[str, truth.Call | None]:
    """The judge's word on each of ``workloads`` checked against llama.cpp's own ratio of the step's answers.

    A workload never judged is allowed only where the step was held (too few requests timed) and llama.cpp's ratio
    is in the tie zone. Returns llama.cpp's call per workload: ``fail``, ``pass`` or None in the tie zone.
    """
    truths = {w: truth.truth_of(step.measured[w], w) for w in workloads}
    bands = truth.Bands.of(proxy.settings.rollout.tolerance)
    return truth.check_judge(
        truths, step.words, bands, unjudged_ok=not step.moved, context=[e.reason for e in step.events]
    )


def served(proxy: Sidecar, step: Step, workloads: tuple[str, ...]) -> dict[str, truth.Side | None]:
    """Where each of ``workloads`` must go now the judge has decided (None: still split); skip if it decided nothing.

    Waits until the proxy routes by the stored rollout.
    """
    if not truth.decided(step.rollout, step.started):
        pytest.skip(f"the judge held the step on {step.words} (llama.cpp's ms per token {step.measured}): "
                    "nothing was decided to route by")  # fmt: skip
    expected = truth.expected_sides(step.rollout, step.words, workloads)
    print(f"  {step.rollout.status}, workloads {dict(step.rollout.workloads)}: served by {expected}")
    proxy.await_rollout(lambda r: truth.routes_as(r, step.rollout), f"the rollout {step.rollout.status}")
    return expected


def routed(proxy: Sidecar, servers: Servers, expected: dict[str, truth.Side | None]) -> None:
    """Requests of each workload ``expected`` gives a pool, every speculative one answered by that pool: the records
    say so, and so does each server's count of the tokens it generated.

    Three speculative ones a workload and as many more as the holdout may take (its target a window: a restarted
    proxy counts its window's holdouts afresh), which go to the plain server.
    """
    before = servers.predicted()
    tokens = dict.fromkeys(SIDES, 0)
    for workload, pool in expected.items():
        if pool is None:
            continue
        answers = [proxy.ask(workload) for _ in range(3 + HOLDOUT_TARGET)]
        sides = proxy.sides(answers)
        assert [s for s in sides if s != "plain"] == [pool] * sides.count(pool) and sides.count(pool) >= 3, sides
        for answer, side in zip(answers, sides, strict=True):
            tokens[side] += answer["usage"]["completion_tokens"]
    grown = {side: n - before[side] for side, n in servers.predicted().items()}
    assert grown == tokens, (grown, tokens)


@dataclass
class Step:
    """What one step of the rollout came to: the judge's events and the servers' speeds."""

    events: list[RolloutEvent]
    measured: dict[str, dict[str, float]]
    moved: bool  # the judge moved the rollout on (False: still held after the most requests a step gets here)
    rollout: Rollout  # as stored at the step's end
    started: int  # the step it began at

    @property
    def words(self) -> dict[str, truth.Word]:
        """The judge's last word on each workload it judged in the step."""
        return truth.judged_words(self.events, self.rollout.judgement)

    def moves(self) -> list[tuple[str, str | None]]:
        """The events' kinds and workloads, without the holds a marginal reading may have cost on the way."""
        return [(e.kind, e.workload) for e in self.events if e.kind != "held"]


def run_step(proxy: Sidecar, workloads: tuple[str, ...]) -> Step:
    """Traffic of the rollout's current step until the judge moves it on.

    A step the judge holds (a workload marginal) gets more requests, as a held step goes on
    collecting in production.
    """
    stored = get_rollout(proxy.engine, _id(proxy))
    assert stored is not None
    answers: dict[str, list[dict[str, Any]]] = {w: [] for w in workloads}
    events: list[RolloutEvent] = []
    for need in (MIN_REQUESTS, MIN_REQUESTS * 3 // 2, MIN_REQUESTS * 2):
        now = get_rollout(proxy.engine, _id(proxy))
        assert now is not None
        for workload in workloads:
            if workload not in now.workloads:  # a workload kept on the current drafter is judged no more
                answers[workload] = proxy.fill(workload, answers[workload], need)
        new = proxy.advance()
        scores(new)
        events += new
        now = get_rollout(proxy.engine, _id(proxy))
        assert now is not None
        if (now.status, now.step) != (stored.status, stored.step):
            return Step(events, speeds(proxy, answers), True, now, stored.step)
    # Still held: whether that was the judge's to do is for :func:`check` to say from llama.cpp's own ratios.
    assert now is not None
    return Step(events, speeds(proxy, answers), False, now, stored.step)


def _id(proxy: Sidecar) -> int:
    ids = [e.rollout_id for e in rollout_events(proxy.engine)]
    assert len(set(ids)) == 1, ids
    return ids[0]


def begin(proxy: Sidecar) -> Rollout:
    """Start the rollout as ``draftwatch rollout start`` does, and wait until the proxy routes by it."""
    rollout = start_rollout(proxy.engine, proxy.settings.proxy, proxy.settings.rollout, datetime.now(UTC))
    proxy.await_rollout(lambda r: r is not None and r.id == rollout.id and r.step == 0, "the rollout's first step")
    return rollout


def test_per_workload_the_candidate_takes_copy_and_story_stays_on_the_current_drafter(
    tmp_path: Path, servers: Servers, clock: None
) -> None:
    with sidecar(tmp_path, servers, DRAFTWATCH_ROLLOUT_PER_WORKLOAD="true") as proxy:
        rollout = begin(proxy)
        assert rollout.id is not None and rollout.per_workload
        # Step 1 (50 %), the last below 100 %: story fails and is kept on the current drafter; copy passes,
        # which promotes the candidate on copy.
        step = run_step(proxy, ("copy", "story"))
        calls = check(proxy, step, ("copy", "story"))
        done = step.rollout
        if calls == {"copy": "pass", "story": "fail"}:
            assert step.moves() == [("kept", "story"), ("promoted", None)], step.events
            assert "story kept on the current drafter (failed): decode_speed fail" in step.events[0].reason
            assert step.events[-1].judgement["workloads"]["copy"]["outcome"] == "pass", step.events[-1].judgement
            assert done.status == "promoted" and dict(done.workloads) == {"copy": "candidate", "story": "current"}
            assert "kept on the current drafter: story" in done.reason
            assert done.share("copy") == 1.0 and done.share("story") == 0.0
        kinds = [e.kind for e in rollout_events(proxy.engine, rollout_id=rollout.id)]
        print(f"  events: {kinds}")
        assert kinds == ["started", *(e.kind for e in step.events)], kinds

        # Whichever way the judge went, the proxy routes each workload as the stored rollout says (promoted on
        # copy: copy to the candidate server, story to the current one).
        routed(proxy, servers, served(proxy, step, ("copy", "story")))


def test_a_candidate_slower_everywhere_is_rolled_back_at_its_first_step(
    tmp_path: Path, servers: Servers, clock: None
) -> None:
    with sidecar(tmp_path, servers) as proxy:
        rollout = begin(proxy)
        assert rollout.id is not None and not rollout.per_workload
        step = run_step(proxy, ("story",))
        calls = check(proxy, step, ("story",))
        events, done = step.events, step.rollout
        if calls["story"] == "fail":
            assert [(e.kind, e.step, e.share) for e in events] == [("rolled_back", 0, 0.0)], events
            assert events[0].reason.startswith("rolled back at step 1: story: decode_speed fail"), events[0].reason
        if step.moved:  # failed, rolled back; or passed in the tie zone: the last step below 100 %, so promoted
            status = "promoted" if step.words["story"].outcome == "pass" else "rolled_back"
            assert step.moves() == [(status, None)] and done.status == status, events
        kinds = [e.kind for e in rollout_events(proxy.engine, rollout_id=rollout.id)]
        assert kinds == ["started", *(e.kind for e in events)], kinds
        # Over: rolled back, the proxy sends every speculative request to the current drafter again (promoted, all
        # to the candidate).
        routed(proxy, servers, served(proxy, step, ("story",)))


def test_a_restarted_proxy_and_scheduler_resume_the_rollout_at_its_stored_step(
    tmp_path: Path, servers: Servers, clock: None
) -> None:
    with sidecar(tmp_path, servers, DRAFTWATCH_ROLLOUT_STEPS="25,50,100") as proxy:
        rollout = begin(proxy)
        assert rollout.id is not None
        first = run_step(proxy, ("copy",))
        check(proxy, first, ("copy",))
        if not truth.decided(first.rollout):
            pytest.skip(f"the judge held step 1 on {first.words} (llama.cpp's ms per token {first.measured})")
        outcome = first.words["copy"].outcome
        assert first.moves() == [("advanced" if outcome == "pass" else "rolled_back", None)], first.events
        assert first.events[-1].step == (1 if outcome == "pass" else 0), first.events
    # The app (its recorder, router and engine) and the test's engine are gone; a new sidecar on the same file.
    with sidecar(tmp_path, servers, DRAFTWATCH_ROLLOUT_STEPS="25,50,100") as proxy:
        if first.rollout.status == "rolled_back":
            # Its first refresh finds no rollout to route by: every request to the current drafter.
            routed(proxy, servers, served(proxy, first, ("copy",)))
            return
        # Its first refresh routes the stored step 2 (50 %).
        proxy.await_rollout(lambda r: r is not None and r.id == rollout.id and r.step == 1, "the stored step 2")
        step = run_step(proxy, ("copy",))
        check(proxy, step, ("copy",))
        kinds = [e.kind for e in rollout_events(proxy.engine, rollout_id=rollout.id)]
        print(f"  events: {kinds}")
        assert kinds == ["started", "advanced", *(e.kind for e in step.events)], kinds
        if not step.moved:  # held on at step 2: resumed there, and still there
            assert (step.rollout.status, step.rollout.step) == ("running", 1), step.rollout
            return
        # The judge's run after the restart was step 2's: passing it promoted the candidate, failing it rolled back.
        outcome = step.words["copy"].outcome
        assert step.events[-1].step == 1, step.events
        assert step.moves() == [("promoted" if outcome == "pass" else "rolled_back", None)], step.events
        assert step.rollout.share("copy") == (1.0 if outcome == "pass" else 0.0)
        routed(proxy, servers, served(proxy, step, ("copy",)))
