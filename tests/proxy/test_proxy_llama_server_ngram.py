"""A real llama-server with an n-gram drafter behind the proxy: a request that drafted nothing is still speculative.

Two llama-servers on smollm2-135m, one plain and one with llama.cpp's prompt-lookup drafter
(``ngram-simple``, n 3, m 8): it drafts where the answer copies its prompt (``copy``) and finds no
match on short questions (``qa``: llama.cpp's answers carry no ``draft_n`` at all, checked here as
the premise). With the plain server as the baseline, every answer of the speculative server is
stored speculative, its draft counts llama.cpp's own (0 where it drafted nothing), and every
answer of the baseline is the holdout (issue 36). Without a baseline, ``auto`` stores the
zero-draft answers plain, flagged ``mode_inferred``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from decoder.models.fetch import fetch_preset
from monitor.api.app import create_app
from monitor.drift.run import run_drift
from monitor.drift.verdict import verdict_of
from monitor.store.engine import create_engine
from tests.api.conftest import make_settings
from tests.proxy.engine import rows
from tests.serving import serving
from tests.stacks.llama_server import BASE_ARGS, LlamaServer, llama_server, require_binary

pytestmark = pytest.mark.models

NGRAM: tuple[str, ...] = (
    "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8",
    "--threads", "1",
)  # fmt: skip
WORDS = "apples, pears, plums, cherries, grapes, lemons, limes, figs, dates, kiwis, melons, peaches"
ENDS = ("nuts", "rice", "beans", "corn")
QUESTIONS = ("Name a colour.", "Who wrote Hamlet? One name only.", "Say hello.")
PER_WORKLOAD = 10


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[LlamaServer, LlamaServer]]:
    binary = require_binary()
    model = fetch_preset("smollm2-135m", progress=False)
    with (
        llama_server(model, *BASE_ARGS, "--threads", "1", binary=binary) as plain,
        llama_server(model, *BASE_ARGS, *NGRAM, binary=binary) as speculative,
    ):
        yield plain, speculative


def drive(url: str) -> list[dict[str, Any]]:
    """``PER_WORKLOAD`` requests each of ``qa`` (short questions) and ``copy`` (a list to copy), interleaved."""
    answers = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for i in range(PER_WORKLOAD):
            qa = {"messages": [{"role": "user", "content": QUESTIONS[i % 3]}], "max_tokens": 8, "temperature": 0}
            prompt = f"Copy the list exactly.\nList: {WORDS}, {ENDS[i % 4]}.\nCopy: apples, pears,"
            copy = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
            for workload, path, body in (("qa", "/v1/chat/completions", qa), ("copy", "/v1/completions", copy)):
                response = client.post(path, json=body, headers={"X-Workload": workload})
                assert response.status_code == 200, response.text
                answers.append({"workload": workload, **response.json()})
    return answers


def sidecar_env(tmp_path: Path, db_url: str, upstream: str, **env: str) -> Any:
    drift = {"DRAFTWATCH_DRIFT_MIN_REQUESTS": "5", "DRAFTWATCH_DRIFT_CURRENT_WINDOW": "30m",
             "DRAFTWATCH_DRIFT_MAX_CURRENT_WINDOW": "30m", "DRAFTWATCH_DRIFT_REFERENCE_WINDOW": "1h"}  # fmt: skip
    return make_settings(tmp_path, db_url, DRAFTWATCH_API_TOKENS="", DRAFTWATCH_PROXY_UPSTREAM=upstream,
                         DRAFTWATCH_PROXY_KIND="llamacpp", **drift, **env)  # fmt: skip


def test_with_a_baseline_every_answer_of_the_ngram_server_is_speculative_drafted_or_not(
    tmp_path: Path, servers: tuple[LlamaServer, LlamaServer]
) -> None:
    plain, speculative = servers
    db_url = f"sqlite:///{tmp_path / 'draftwatch.db'}"
    settings = sidecar_env(tmp_path, db_url, speculative.url, DRAFTWATCH_PROXY_BASELINE_UPSTREAM=plain.url,
                           DRAFTWATCH_DECODER_HOLDOUT_SHARE="0.5", DRAFTWATCH_DECODER_HOLDOUT_MAX_SHARE="0.5",
                           DRAFTWATCH_DECODER_HOLDOUT_TARGET="0")  # fmt: skip
    app = create_app(settings)
    with serving(app) as url:
        answers = drive(url)
        assert app.state.api.recorder.flush(10)
    stored = {r["request_id"]: r for r in rows(db_url)}
    assert len(stored) == len(answers) == 2 * PER_WORKLOAD
    spec = [a for a in answers if stored[a["id"]]["mode"] != "holdout"]
    # The premise, from llama.cpp alone: the drafter found no match on some questions and drafted on copies.
    assert any("draft_n" not in a["timings"] for a in spec if a["workload"] == "qa"), spec
    assert any(a["timings"].get("draft_n", 0) > 0 for a in spec if a["workload"] == "copy"), spec
    for a in spec:
        record = stored[a["id"]]
        assert (record["mode"], record["mode_inferred"]) == ("speculative", 0), record
        assert (record["num_draft_tokens"], record["num_accepted_tokens"]) == (
            a["timings"].get("draft_n", 0),
            a["timings"].get("draft_n_accepted", 0),
        )
    held = [stored[a["id"]] for a in answers if stored[a["id"]]["mode"] == "holdout"]
    assert len(held) == PER_WORKLOAD and {r["num_draft_tokens"] for r in held} == {0}
    # qa, whose speculative requests mostly drafted nothing, is compared with its own baseline.
    engine = create_engine(db_url)
    try:
        run = run_drift(engine, settings.drift, datetime.now(UTC) + timedelta(seconds=1))
    finally:
        engine.dispose()
    qa = verdict_of(next(r for r in run.results if r.test == "net_loss" and r.workload == "qa"))
    assert qa.verdict != "not_measured" and qa.n_speculative == PER_WORKLOAD // 2, qa


def test_without_a_baseline_auto_stores_the_zero_draft_answers_plain_and_flags_them(
    tmp_path: Path, servers: tuple[LlamaServer, LlamaServer]
) -> None:
    _, speculative = servers
    db_url = f"sqlite:///{tmp_path / 'draftwatch.db'}"
    app = create_app(sidecar_env(tmp_path, db_url, speculative.url))
    with serving(app) as url:
        answers = drive(url)
        assert app.state.api.recorder.flush(10)
    stored = {r["request_id"]: r for r in rows(db_url)}
    for a in answers:
        drafted = "draft_n" in a["timings"]
        expected = ("speculative", 0) if drafted else ("plain", 1)
        assert (stored[a["id"]]["mode"], stored[a["id"]]["mode_inferred"]) == expected, a["timings"]
    assert any("draft_n" not in a["timings"] for a in answers)
