"""The ledger's counters on ``/metrics`` of the real app over HTTP: recorded speculative tokens valued at their load.

A store holds the crossing stand-ins (tests/drift/ledger_records.py) of the last two hours; the
scheduler's drift job stores the ledger's rates, the app reads them, and new speculative requests then
arrive at 1 in flight (speculation gains), at 8 (it loses), at 64 (no level measured there) and with no
load recorded. Each counter must equal the tokens times the rate the ledger itself gives for that level.
The app never reads the day's ledger itself (seconds of Python on its event loop's interpreter, issue
49): before a drift run stored rates, it values nothing.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import Engine

from monitor.api.app import create_app
from monitor.drift.detectors.ledger import read_ledger
from monitor.drift.settings import DriftSettings
from monitor.scheduler.jobs import drift_job
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from tests.api.conftest import INGEST, READ, auth, bodies, make_settings
from tests.drift.conftest import store
from tests.drift.ledger_records import stream
from tests.serving import serving

SAVED = 'draftwatch_speculation_gpu_seconds_saved_total{workload="chat"}'
LOST = 'draftwatch_speculation_gpu_seconds_lost_total{workload="chat"}'


def scrape(client: httpx.Client) -> dict[str, float]:
    response = client.get("/metrics", headers=auth(READ))
    assert response.status_code == 200
    samples = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def crossing_store(tmp_path: Path) -> tuple[str, Engine, datetime]:
    url = f"sqlite:///{tmp_path / 'draftwatch.db'}"
    engine = create_engine(url)
    upgrade(engine)
    now = datetime.now(UTC)
    store(engine, stream(now - timedelta(hours=2), 60))
    return url, engine, now


def test_before_a_drift_run_stored_rates_nothing_is_valued(tmp_path: Path) -> None:
    url, _, now = crossing_store(tmp_path)
    app = create_app(make_settings(tmp_path, url))
    with serving(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        scrape(client)  # the first scrape starts the read of the rates
        fresh = [r for r in stream(now - timedelta(minutes=70), 1) if r.mode == "speculative"]
        response = client.post("/v1/events", json={"events": bodies(fresh[:1])}, headers=auth(INGEST))
        assert response.status_code == 202, response.text
        app.state.api.recorder.flush(10)
        # A sidecar that read the ledger itself shows its crossover within a second of its first scrape here.
        watched_until = time.monotonic() + 3
        while time.monotonic() < watched_until:
            samples = scrape(client)
            assert not any(name.startswith("draftwatch_speculation_crossover_inflight") for name in samples)
            time.sleep(0.1)
    assert samples.get(SAVED, 0) == 0 and samples.get(LOST, 0) == 0
    outcome = 'draftwatch_speculation_ledger_tokens_total{workload="chat",outcome="unmeasured"}'
    assert samples[outcome] == fresh[0].output_tokens - 1


def test_the_counters_value_each_token_at_its_load(tmp_path: Path) -> None:
    url, engine, now = crossing_store(tmp_path)
    settings = make_settings(tmp_path, url)
    drift_job(engine, settings, now, lambda conn: None)
    (chat,) = read_ledger(engine, DriftSettings(), now - timedelta(days=1), now + timedelta(minutes=1)).workloads
    rate = {b.level.first: (b.level.plain_ms - b.level.spec_ms) / 1000 for b in chat.bills}  # type: ignore[operator]
    pair = chat.pair.label
    app = create_app(settings)
    with serving(app) as base, httpx.Client(base_url=base, timeout=10) as client:
        deadline = time.monotonic() + 30
        crossover = f'draftwatch_speculation_crossover_inflight{{workload="chat",pair="{pair}"}}'
        while (samples := scrape(client)).get(crossover) != 4:
            assert time.monotonic() < deadline, "the stored rates were never read"
            time.sleep(0.1)
        assert SAVED not in samples  # nothing recorded by this process yet
        fresh = [r for r in stream(now - timedelta(minutes=70), 1) if r.mode == "speculative"]
        at = {1: fresh[0], 8: fresh[3]}  # the stand-ins' loads 1, 2, 4, 8
        arriving = [
            *at.values(),
            dataclasses.replace(fresh[1], upstream_inflight=64),
            dataclasses.replace(fresh[2], upstream_inflight=None),
        ]
        response = client.post("/v1/events", json={"events": bodies(arriving)}, headers=auth(INGEST))
        assert response.status_code == 202, response.text
        app.state.api.recorder.flush(10)
        samples = scrape(client)
    tokens = {load: r.output_tokens - 1 for load, r in at.items()}
    assert rate[1] > 0 > rate[4]  # level 4 holds 8 in flight
    assert samples[SAVED] == pytest.approx(tokens[1] * rate[1], rel=1e-9)
    assert samples[LOST] == pytest.approx(tokens[8] * -rate[4], rel=1e-9)
    outcome = 'draftwatch_speculation_ledger_tokens_total{{workload="chat",outcome="{}"}}'
    assert samples[outcome.format("saved")] == tokens[1] and samples[outcome.format("lost")] == tokens[8]
    unmeasured = fresh[1].output_tokens - 1 + fresh[2].output_tokens - 1
    assert samples[outcome.format("unmeasured")] == unmeasured
    assert samples[outcome.format("inconclusive")] == 0
