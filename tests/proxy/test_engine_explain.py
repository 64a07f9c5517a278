"""Why acceptance fell, staged on a real engine: a new system prompt in one workload behind the proxy; a mix shift.

One real llama-server (smollm2-135m, the greedy n-gram drafter of test_engine_verdict.py) behind the
sidecar. Two workloads of chat requests, each asking to repeat a list of words under a system prompt:
the answers copy the prompt, so the n-gram drafts are accepted (26 of 28 measured). In the current
window, two of every three ``extract`` requests carry a new system prompt asking for a story instead:
those answers copy little and nearly every draft is rejected. ``steady`` stays as it was: the A/A
beside the change. The drift run must find the fall within extract and name its cause, the new style
(with the copy share it brings, content), in ``drift explain``'s parts and in the acceptance alert,
and name nothing about steady. The windows are cut at a minute boundary, as the rollups are.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy.engine import Engine

from decoder.models.fetch import fetch_preset
from monitor.alerts.evaluate import evaluate_alerts
from monitor.alerts.queries import list_alerts
from monitor.api.app import create_app
from monitor.config import Settings
from monitor.drift.explain import sentence
from monitor.drift.run import DriftRun, run_drift
from monitor.store.engine import create_engine
from tests.api.conftest import make_settings
from tests.proxy.test_engine_verdict import GREEDY_NGRAM, WORDS
from tests.serving import serving, wait_for
from tests.stacks.llama_server import BASE_ARGS, build_number, llama_server, require_binary

pytestmark = pytest.mark.models

COPY = "Repeat the user's list exactly, word for word, and nothing else."
STORY = "Write a short, original story for children. Do not list things."
SUFFIXES = ("nuts", "beans", "rice", "corn")
PER_PHASE = 24  # per workload and window; the new style takes 16 of extract's current 24
WATCH_S = 0.2  # the engine watch's interval: a restarted replica's new drafter is read within it


def listed(i: int) -> str:
    """The ``i``-th list to repeat."""
    return f"{WORDS}, {SUFFIXES[i % 4]}"


def ask(client: httpx.Client, url: str, workload: str, system: str, user: str) -> None:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    body = {"max_tokens": 32, "temperature": 0, "messages": messages}
    response = client.post(f"{url}/v1/chat/completions", json=body, headers={"X-Workload": workload})
    assert response.status_code == 200, response.text


def next_minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0) + timedelta(minutes=1)


# One request to send: (workload, system prompt, user message).
Ask = tuple[str, str, str]


class Staged(NamedTuple):
    run: DriftRun
    engine: Engine
    settings: Settings
    now: datetime


class Replicas(NamedTuple):
    upstream: str  # the sidecar's proxy.upstream
    between: Callable[[Any], None]  # what changes between the windows beyond the requests, given the app


@contextmanager
def one_replica(model: Path) -> Iterator[Replicas]:
    with llama_server(model, *BASE_ARGS, *GREEDY_NGRAM, binary=require_binary()) as server:
        yield Replicas(server.url, lambda _app: None)


@contextmanager
def staged(
    tmp_path: Path,
    before: Sequence[Ask],
    after: Sequence[Ask],
    min_requests: int,
    replicas: Callable[[Path], AbstractContextManager[Replicas]] = one_replica,
) -> Iterator[Staged]:
    """``before`` and then ``after`` sent through the sidecar to real llama-servers, either side of a minute
    boundary (the rollups' cut); the drift run over exactly those two windows, and its store."""
    model = fetch_preset("smollm2-135m", progress=False)
    db_url = f"sqlite:///{tmp_path / 'draftwatch.db'}"
    with replicas(model) as (upstream, between):
        settings = make_settings(
            tmp_path,
            db_url,
            DRAFTWATCH_API_TOKENS="",
            DRAFTWATCH_PROXY_UPSTREAM=upstream,
            DRAFTWATCH_PROXY_ENGINE_WATCH_S=str(WATCH_S),
            DRAFTWATCH_DECODER_HOLDOUT_SHARE="0",
            # Lowered from 30 so that one short run decides; each window holds this run alone.
            DRAFTWATCH_DRIFT_MIN_REQUESTS=str(min_requests),
            DRAFTWATCH_DRIFT_EXPLAIN_MIN_REQUESTS=str(min_requests),
        )
        app = create_app(settings)
        with serving(app) as url, httpx.Client(timeout=120) as client:
            # Every record carries what the watch read of its replica: the first requests wait for a first read.
            wait_for(lambda: all(m.engine.answering for m in app.state.api.router.members()), "a first read")
            started = datetime.now(UTC)
            for request in before:
                ask(client, url, *request)
            between(app)
            boundary = next_minute(datetime.now(UTC))
            time.sleep(max(0.0, (boundary - datetime.now(UTC)).total_seconds()) + 0.5)
            for request in after:
                ask(client, url, *request)
            assert app.state.api.recorder.flush(10)
            ended = datetime.now(UTC)
    engine = create_engine(db_url)
    try:
        current = next_minute(ended) - boundary
        reference = boundary - started.replace(second=0, microsecond=0)
        now = boundary + current - timedelta(seconds=1)
        run = run_drift(engine, settings.drift, now, current=current, reference=reference)
        yield Staged(run, engine, settings, now)
    finally:
        engine.dispose()


def test_a_new_system_prompt_is_named_as_the_cause(tmp_path: Path) -> None:
    before = [(workload, COPY, listed(i)) for i in range(PER_PHASE) for workload in ("extract", "steady")]
    # In the current window two of every three extract requests carry the new system prompt.
    after = [
        (w, COPY if w == "steady" or i % 3 == 2 else STORY, listed(i))
        for i in range(PER_PHASE)
        for w in ("extract", "steady")
    ]
    with staged(tmp_path, before, after, min_requests=8) as (run, engine, settings, now):
        e = run.explanation
        assert e is not None and e.change is not None and e.change < -0.1, e
        parts = {(p.cause, p.workload): p for p in e.parts}
        said = [(p.cause, p.workload, round(p.value, 3), p.named) for p in e.parts]
        # Nothing about steady is named: its requests were the same in both windows.
        assert not any(p.named for p in e.parts if p.workload == "steady"), said
        style = parts[("style", "extract")]
        assert style.named and style.value < 0, said
        new = style.detail["lead"]
        assert new.startswith("system prompt ") and style.detail["cells"][new]["share_ref"] == 0.0, said
        # The new style and the copy share it brought hold most of extract's fall between them.
        within = style.detail["within"]["value"]
        explained = style.value + (parts[("content", "extract")].value if ("content", "extract") in parts else 0.0)
        assert explained / within > 0.7, said
        evaluate_alerts(engine, settings.alert_config, run.results, now=now)
        (alert,) = [a for a in list_alerts(engine) if a.rule == "acceptance_drop"]
        description = alert.annotations["description"]
        assert alert.labels["workload"] == "extract" and "within extract" in description, description
        assert f"from style ({new} 0 % -> " in description, description


def test_a_mix_shift_is_named_as_the_mix(tmp_path: Path) -> None:
    """(a) in the issue: the traffic moves towards a workload that accepts little, each workload's own rate stays.

    ``lists`` asks to repeat a list (its drafts accepted), ``stories`` for a story (nearly none): 3 to 1 in
    the reference window, 1 to 3 in the current one. The fall is the mix's, named as such and nothing within.
    """
    # 21 of one workload and 7 of the other a window: over drift.explain_min_requests (6) both.
    lists, stories = ("lists", COPY), ("stories", STORY)
    before = [(*w, listed(i)) for i in range(21) for w in ([lists, stories] if i % 3 == 0 else [lists])]
    after = [(*w, listed(i)) for i in range(21) for w in ([stories, lists] if i % 3 == 0 else [stories])]
    with staged(tmp_path, before, after, min_requests=6) as (run, _, _, _):
        e = run.explanation
        assert e is not None and e.change is not None and e.change < -0.1, e
        said = [(p.cause, p.workload, round(p.value, 3), p.named) for p in e.parts]
        assert {(p.cause, p.workload) for p in e.named} == {("mix", None)}, said
        mix = next(p for p in e.parts if p.cause == "mix")
        assert mix.value / e.change > 0.7, said
        # The sentence names the workload whose share moved the pooled rate most, either side of the move.
        said_mix = sentence(e)
        assert "from the mix moving away from lists (" in said_mix or "from the mix moving to stories (" in said_mix


# The drafter replica b is restarted with: ngram-mod keyed on one token, two drafts a step. On the lists
# it drafts about as many tokens as ngram-simple (27 against 28 a request), and 63 % of them are accepted
# against 93 %: the replica's share of drafts holds, its acceptance falls.
REDRAFTED: tuple[str, ...] = (
    "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "1", "--spec-ngram-mod-n-min", "1",
    "--spec-ngram-mod-n-max", "2", "--threads", "1",
)  # fmt: skip


def warm(url: str) -> None:
    """One request straight to the replica: llama.cpp's /slots names the drafter once a slot has served."""
    body = {"max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).status_code == 200


@contextmanager
def one_replica_redrafted(model: Path) -> Iterator[Replicas]:
    """Two replicas, both drafting with ngram-simple; between the windows replica b is restarted at its
    address with another drafter (:data:`REDRAFTED`), as a rollout of one pod would."""
    binary = require_binary()
    with ExitStack() as stack:
        a = stack.enter_context(llama_server(model, *BASE_ARGS, *GREEDY_NGRAM, binary=binary))
        first_b = stack.enter_context(ExitStack())
        b = first_b.enter_context(llama_server(model, *BASE_ARGS, *GREEDY_NGRAM, binary=binary))
        for server in (a, b):
            warm(server.url)

        def redraft(app: Any) -> None:
            first_b.close()
            port = urlsplit(b.url).port
            warm(stack.enter_context(llama_server(model, *BASE_ARGS, *REDRAFTED, binary=binary, port=port)).url)
            member = next(m for m in app.state.api.router.members() if m.upstream.url.rstrip("/") == b.url)
            wait_for(lambda: member.engine.drafter == "ngram-mod", lambda: member.engine, every_s=WATCH_S / 4)

        yield Replicas(f"{a.url},{b.url}", redraft)


def test_a_drafter_changed_on_one_of_two_replicas_is_named_as_a_version(tmp_path: Path) -> None:
    """(c) in the issue: one replica of two restarted with another drafter, the other one unchanged.

    Both replicas serve both windows, so the replica's share of drafts does not move; the new drafter's
    does, and it accepts less: the fall within the workload is the version's (the drafter as the engine
    names it, read by the engine watch), an effect since the old drafter served beside it.
    """
    before = [("lists", COPY, listed(i)) for i in range(PER_PHASE)]
    after = [("lists", COPY, listed(i)) for i in range(PER_PHASE)]
    with staged(tmp_path, before, after, 8, replicas=one_replica_redrafted) as (run, engine, settings, now):
        e = run.explanation
        assert e is not None and e.change is not None and e.change < -0.1, e
        said = [(p.cause, p.workload, round(p.value, 3), p.named) for p in e.parts]
        parts = {(p.cause, p.workload): p for p in e.parts}
        version = parts[("version", "lists")]
        assert {(p.cause, p.workload) for p in e.named} <= {("within", "lists"), ("version", "lists")}, said
        assert version.named and version.value / version.detail["within"]["value"] > 0.7, said
        # The engine's build as llama.cpp names it (/props build_info): "b<build>-unknown" for this source build.
        new = f"upstream, drafter ngram-mod, engine b{build_number(require_binary())}"
        assert version.detail["lead"].startswith(new), version.detail
        assert version.detail["same_window"], version.detail
        evaluate_alerts(engine, settings.alert_config, run.results, now=now)
        (alert,) = [a for a in list_alerts(engine) if a.rule == "acceptance_drop"]
        description = alert.annotations["description"]
        assert f"from version: {new}" in description, description
        # Beside the old drafter, as measured in the same window on the replica left as it was.
        versus = version.detail["versus"]
        old = version.detail["cells"][versus]["rate_cur"]
        assert versus.startswith("upstream, drafter ngram-simple"), version.detail
        assert old > version.detail["cells"][version.detail["lead"]]["rate_cur"] + 0.1, version.detail
        assert f"against {old:.2f} for {versus} in the same window" in description, description


def test_longer_prompts_are_named_as_length(tmp_path: Path) -> None:
    """(d) in the issue: extract's requests grow long, under the same system prompt; steady's stay as they were.

    The longer messages open with notes listing the same words in other orders (about 480 prompt tokens
    against 93): the small model's copy wanders between the orders it read, and the n-gram drafter,
    drafting what followed a word's last occurrence, guesses wrong half the time. Wandering, the answers
    also copy fewer of the prompt's n-grams: every long prompt's answer copies less, so in this data
    length and content moved together and the split shares the fall between them (Shapley gives a
    shared explanation to both). Length is named, led by the long prompts, and the two hold the fall.
    """
    words = WORDS.split(", ")
    notes = " ".join(f"Not to repeat: {', '.join(random.Random(j).sample(words, len(words)))}." for j in range(6))
    before = [(w, COPY, listed(i)) for i in range(PER_PHASE) for w in ("extract", "steady")]
    after = [(w, COPY, f"{notes}\n\nThe list: {listed(i)}" if w == "extract" else listed(i)) for i in range(PER_PHASE)
             for w in ("extract", "steady")]  # fmt: skip
    with staged(tmp_path, before, after, min_requests=8) as (run, engine, settings, now):
        e = run.explanation
        assert e is not None and e.change is not None and e.change < -0.1, e
        said = [(p.cause, p.workload, round(p.value, 3), p.named) for p in e.parts]
        assert not any(p.named for p in e.parts if p.workload == "steady"), said
        parts = {(p.cause, p.workload): p for p in e.parts}
        length, content = parts[("length", "extract")], parts[("content", "extract")]
        assert length.named and length.detail["lead"].startswith("prompt 256-1023 tokens"), length.detail
        assert (length.value + content.value) / length.detail["within"]["value"] > 0.7, said
        assert {p.cause for p in e.named if p.workload == "extract"} <= {"within", "length", "content"}, said
        evaluate_alerts(engine, settings.alert_config, run.results, now=now)
        (alert,) = [a for a in list_alerts(engine) if a.rule == "acceptance_drop"]
        assert "from length (prompt 256-1023 tokens" in alert.annotations["description"], alert.annotations
