"""``/metrics`` of the real app on a real database: every family described, labels, zeros, bounds, TPOT."""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from decoder.record import RequestRecord
from monitor.api.app import create_app
from monitor.api.reads.metrics import MAX_LABEL_SETS, MAX_POSITIONS
from monitor.ingest.synthetic import synthetic_record
from tests.api.conftest import INGEST, READ, auth, bodies, make_settings

# The documented families (docs/api.md, "Metrics"), in the order they are exposed.
FAMILIES = (
    "draftwatch_build_info",
    "draftwatch_requests_total",
    "draftwatch_request_errors_total",
    "draftwatch_prompt_tokens_total",
    "draftwatch_generation_tokens_total",
    "draftwatch_spec_decode_num_drafts_total",
    "draftwatch_spec_decode_num_draft_tokens_total",
    "draftwatch_spec_decode_num_accepted_tokens_total",
    "draftwatch_spec_decode_num_accepted_tokens_per_pos_total",
    "draftwatch_request_time_per_output_token_seconds",
    "draftwatch_time_to_first_token_seconds",
    "draftwatch_recorder_queued_records",
    "draftwatch_recorder_written_total",
    "draftwatch_recorder_spooled_total",
    "draftwatch_recorder_replayed_total",
    "draftwatch_recorder_duplicates_total",
    "draftwatch_recorder_rejected_total",
    "draftwatch_recorder_failed_total",
    "draftwatch_recorder_spool_pending",
    "draftwatch_recorder_database_available",
    "draftwatch_drift_decision",
    "draftwatch_drift_effect",
    "draftwatch_drift_last_run_timestamp_seconds",
    "draftwatch_health_signal",
    "draftwatch_speculation_speedup",
    "draftwatch_speculation_verdict",
    "draftwatch_alerts",
    "draftwatch_scrape_target_up",
    "draftwatch_scraped_acceptance_rate",
    "draftwatch_rollout_step",
    "draftwatch_rollout_share",
    "draftwatch_rollout_score",
    "draftwatch_rollout_decode_speed_ratio",
    "draftwatch_speculation_gpu_seconds_saved_total",
    "draftwatch_speculation_gpu_seconds_lost_total",
    "draftwatch_speculation_ledger_tokens_total",
    "draftwatch_speculation_crossover_inflight",
)
API_DOC = Path(__file__).resolve().parents[2] / "docs/api.md"
SPEC = 'workload="code",target="qwen-coder-1.5b",drafter="model:qwen-coder-0.5b"'
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(tmp_path, f"sqlite:///{tmp_path / 'draftwatch.db'}"))) as test_client:
        yield test_client


def scrape(client: TestClient) -> dict[str, float]:
    """The samples of one scrape, by ``name{labels}``; fails on a line that is not the text format."""
    response = client.get("/metrics", headers=auth(READ))
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in response.text.splitlines():
        if line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, line
        samples[match[1] + (match[2] or "")] = float(match[3])
    return samples


def described(client: TestClient) -> list[str]:
    return [
        line.split()[2]
        for line in client.get("/metrics", headers=auth(READ)).text.splitlines()
        if line.startswith("# TYPE")
    ]


def post(client: TestClient, records: list[RequestRecord]) -> None:
    response = client.post("/v1/events", json={"events": bodies(records)}, headers=auth(INGEST))
    assert response.status_code == 202, response.text
    client.app.state.api.recorder.flush(10)  # type: ignore[attr-defined]


def test_every_family_is_described_before_any_record(client: TestClient) -> None:
    assert described(client) == list(FAMILIES)
    deadline = time.monotonic() + 10
    while 'draftwatch_health_signal{check="dead_letters"}' not in (samples := scrape(client)):
        assert time.monotonic() < deadline, "the database's figures were never read"
        time.sleep(0.1)
    assert samples[f'draftwatch_build_info{{version="{version("draftwatch")}"}}'] == 1
    # Every enabled default rule is there at zero, so an alert panel has a series from the start.
    assert samples['draftwatch_alerts{alertname="net_loss",severity="critical",state="firing"}'] == 0
    assert samples['draftwatch_alerts{alertname="acceptance_drop",severity="warning",state="pending"}'] == 0
    assert samples['draftwatch_health_signal{check="dead_letters"}'] == 0
    assert not [name for name in samples if name.startswith(("draftwatch_requests_total", "draftwatch_drift_"))]


def test_every_family_is_documented() -> None:
    section = API_DOC.read_text().split("### Metrics", 1)[1].split("\n### ", 1)[0]
    documented = set()
    for name in re.findall(r"`(draftwatch_[a-z_{},]+)`", section):
        head, _, rest = name.partition("{")
        inner, _, tail = rest.partition("}")
        documented |= {f"{head}{part}{tail}" for part in inner.split(",")} if rest else {name}
    assert set(FAMILIES) <= documented


def test_request_time_per_output_token_leaves_the_first_token_out(client: TestClient) -> None:
    # 900 ms to the first token, then 10 ms for each further one, as vLLM counts it.
    first = synthetic_record(1, workload="code")
    record = dataclasses.replace(first, ttft_ms=900.0, latency_ms=900.0 + 10.0 * (first.output_tokens - 1))
    post(client, [record])
    samples = scrape(client)
    spec = f'{SPEC},mode="speculative"'
    assert samples[f"draftwatch_request_time_per_output_token_seconds_sum{{{spec}}}"] == pytest.approx(0.01)
    assert samples[f'draftwatch_request_time_per_output_token_seconds_bucket{{{spec},le="0.01"}}'] == 1
    assert samples[f'draftwatch_request_time_per_output_token_seconds_bucket{{{spec},le="0.005"}}'] == 0
    assert samples[f"draftwatch_time_to_first_token_seconds_sum{{{spec}}}"] == pytest.approx(0.9)


def test_a_new_label_set_starts_at_zero_in_every_mode_and_position(client: TestClient) -> None:
    post(client, [synthetic_record(1, workload="code", gamma=4)])
    samples = scrape(client)
    for family in ("requests", "request_errors", "prompt_tokens", "generation_tokens"):
        assert samples[f'draftwatch_{family}_total{{{SPEC},mode="plain"}}'] == 0
        assert samples[f'draftwatch_{family}_total{{{SPEC},mode="holdout"}}'] == 0
    assert samples[f'draftwatch_requests_total{{{SPEC},mode="speculative"}}'] == 1
    assert samples[f'draftwatch_request_time_per_output_token_seconds_count{{{SPEC},mode="holdout"}}'] == 0
    assert samples[f'draftwatch_time_to_first_token_seconds_bucket{{{SPEC},mode="plain",le="+Inf"}}'] == 0
    per_pos = "draftwatch_spec_decode_num_accepted_tokens_per_pos_total"
    assert {name for name in samples if name.startswith(per_pos)} == {
        f'{per_pos}{{{SPEC},position="{p}"}}' for p in range(4)
    }


def test_label_sets_and_positions_are_bounded(client: TestClient) -> None:
    extra = 3
    records = [synthetic_record(i, workload=f"w{i}") for i in range(MAX_LABEL_SETS + extra)]
    wide = synthetic_record(0, workload="w0", prefix="wide", gamma=MAX_POSITIONS + 8)
    post(client, [*records, wide])
    samples = scrape(client)
    requests = [name for name in samples if name.startswith("draftwatch_requests_total{")]
    assert len(requests) == 3 * (MAX_LABEL_SETS + 1)  # three modes per label set, the folded one included
    other = 'workload="_other",target="_other",drafter="_other"'
    assert samples[f'draftwatch_requests_total{{{other},mode="speculative"}}'] == extra
    w0 = 'workload="w0",target="qwen-coder-1.5b",drafter="model:qwen-coder-0.5b"'
    per_pos = [
        name for name in samples if name.startswith(f"draftwatch_spec_decode_num_accepted_tokens_per_pos_total{{{w0}")
    ]
    assert len(per_pos) == MAX_POSITIONS + 1
    folded = samples[f'draftwatch_spec_decode_num_accepted_tokens_per_pos_total{{{w0},position="_other"}}']
    assert folded == sum(wide.accepted_per_position[MAX_POSITIONS:])


def test_an_active_rollouts_step_share_and_judgement_per_workload(client: TestClient) -> None:
    """A rollout judged on stored records, as the scheduler judges it: /metrics shows the stored figures."""
    from datetime import timedelta

    from monitor.proxy.rollout import advance_rollouts, start_rollout
    from monitor.store.rollouts import get_rollout
    from tests.proxy.test_rollout import INTERVAL, PROXY, interval_of, rollout_settings
    from tests.records import T0

    engine = client.app.state.api.engine  # type: ignore[attr-defined]
    settings = rollout_settings(per_workload=True)
    r = start_rollout(engine, PROXY, settings, T0)
    assert r.id is not None
    interval_of(engine, T0, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
    interval_of(engine, T0, {"rare": (10.0, 10.0)}, n=5)
    # story is kept on the current drafter; copy passes and the rollout advances to its second step.
    kinds = [e.kind for e in advance_rollouts(engine, settings, T0 + INTERVAL + timedelta(seconds=1))]
    assert kinds == ["kept", "advanced"]
    stored = get_rollout(engine, r.id)
    assert stored is not None and stored.step == 1
    deadline = time.monotonic() + 10
    rollout = f'deployment="*",drafter="ngram-greedy",rollout="{r.id}"'
    while f"draftwatch_rollout_step{{{rollout}}}" not in (samples := scrape(client)):
        assert time.monotonic() < deadline, "the database's figures were never read"
        time.sleep(0.1)
    assert samples[f"draftwatch_rollout_step{{{rollout}}}"] == 2
    assert samples[f"draftwatch_rollout_share{{{rollout}}}"] == 0.5
    judged = stored.judgement["workloads"]
    assert set(judged) == {"copy", "story", "rare"}
    for workload, found in judged.items():
        (speed,) = [m for m in found["metrics"] if m["metric"] == "decode_speed"] or [{"ratio": None}]
        score = samples[f'draftwatch_rollout_score{{{rollout},workload="{workload}"}}']
        ratio = samples[f'draftwatch_rollout_decode_speed_ratio{{{rollout},workload="{workload}"}}']
        assert (score == found["score"]) if found["score"] is not None else math.isnan(score), workload
        assert (ratio == pytest.approx(speed["ratio"])) if speed["ratio"] is not None else math.isnan(ratio)
    copy = judged["copy"]
    assert copy["outcome"] == "pass" and copy["score"] == 100
    assert samples[f'draftwatch_rollout_decode_speed_ratio{{{rollout},workload="copy"}}'] > 1.2  # 10 ms over 7
    assert math.isnan(samples[f'draftwatch_rollout_score{{{rollout},workload="rare"}}'])  # unjudged: too few
    assert samples['draftwatch_health_signal{check="rollout_step",deployment="*",step="2"}'] == 1
    assert samples['draftwatch_health_signal{check="rollout_rollback",deployment="*",workload="story"}'] == 1
    assert samples['draftwatch_health_signal{check="rollout_promotion",deployment="*"}'] == 0
