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

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

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
from tests.serving import serving
from tests.stacks.llama_server import BASE_ARGS, llama_server, require_binary

pytestmark = pytest.mark.models

COPY = "Repeat the user's list exactly, word for word, and nothing else."
STORY = "Write a short, original story for children. Do not list things."
SUFFIXES = ("nuts", "beans", "rice", "corn")
PER_PHASE = 24  # per workload and window; the new style takes 16 of extract's current 24


def ask(client: httpx.Client, url: str, workload: str, system: str, i: int) -> None:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": f"{WORDS}, {SUFFIXES[i % 4]}"}]
    body = {"max_tokens": 32, "temperature": 0, "messages": messages}
    response = client.post(f"{url}/v1/chat/completions", json=body, headers={"X-Workload": workload})
    assert response.status_code == 200, response.text


def next_minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0) + timedelta(minutes=1)


# One request to send: (workload, system prompt, index of the list's last word).
Ask = tuple[str, str, int]


class Staged(NamedTuple):
    run: DriftRun
    engine: Engine
    settings: Settings
    now: datetime


@contextmanager
def staged(tmp_path: Path, before: Sequence[Ask], after: Sequence[Ask], min_requests: int) -> Iterator[Staged]:
    """``before`` and then ``after`` sent through the sidecar to a real llama-server, either side of a minute
    boundary (the rollups' cut); the drift run over exactly those two windows, and its store."""
    model = fetch_preset("smollm2-135m", progress=False)
    db_url = f"sqlite:///{tmp_path / 'draftwatch.db'}"
    with llama_server(model, *BASE_ARGS, *GREEDY_NGRAM, binary=require_binary()) as engine_server:
        settings = make_settings(
            tmp_path,
            db_url,
            DRAFTWATCH_API_TOKENS="",
            DRAFTWATCH_PROXY_UPSTREAM=engine_server.url,
            DRAFTWATCH_DECODER_HOLDOUT_SHARE="0",
            # Lowered from 30 so that one short run decides; each window holds this run alone.
            DRAFTWATCH_DRIFT_MIN_REQUESTS=str(min_requests),
            DRAFTWATCH_DRIFT_EXPLAIN_MIN_REQUESTS=str(min_requests),
        )
        app = create_app(settings)
        with serving(app) as url, httpx.Client(timeout=120) as client:
            started = datetime.now(UTC)
            for request in before:
                ask(client, url, *request)
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
    before = [(workload, COPY, i) for i in range(PER_PHASE) for workload in ("extract", "steady")]
    # In the current window two of every three extract requests carry the new system prompt.
    after = [
        (w, COPY if w == "steady" or i % 3 == 2 else STORY, i) for i in range(PER_PHASE) for w in ("extract", "steady")
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
    before = [(*w, i) for i in range(21) for w in ([lists, stories] if i % 3 == 0 else [lists])]
    after = [(*w, i) for i in range(21) for w in ([stories, lists] if i % 3 == 0 else [stories])]
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
