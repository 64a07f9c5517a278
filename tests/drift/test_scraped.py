"""Drift over scraped intervals: found when a series' acceptance drops, quiet when it does not, alerted as any drop."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import insert
from sqlalchemy.engine import Engine

from monitor.alerts.evaluate import evaluate_alerts
from monitor.alerts.queries import list_alerts
from monitor.alerts.settings import AlertConfig, AlertSettings
from monitor.drift.detectors.scraped import IntervalAcceptanceDrift
from monitor.drift.run import run_drift
from monitor.store.scrape import ScrapeIntervalRow

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
STEP = timedelta(seconds=30)


def simulated(rng: np.random.Generator, start: datetime, count: int, alpha: float) -> list[dict[str, object]]:
    """30 s intervals of an engine drafting ~600 tokens each, whose acceptance wanders with the traffic mix."""
    drafted = rng.poisson(600, count)
    accepted = rng.binomial(drafted, rng.beta(alpha * 60, (1 - alpha) * 60, count))
    return [
        {"target": "vllm-a", "kind": "vllm", "workload": "chat", "target_model": "llama-8b", "drafter": "eagle",
         "started_at": start + STEP * i, "ended_at": start + STEP * (i + 1), "drafts": int(d) // 3,
         "draft_tokens": int(d), "accepted_tokens": int(a), "accepted_per_position": None, "reset": False}
        for i, (d, a) in enumerate(zip(drafted, accepted, strict=True))
    ]  # fmt: skip


def store(engine: Engine, current_alpha: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = simulated(rng, NOW - timedelta(hours=25), 2880, 0.70)
    rows += simulated(rng, NOW - timedelta(hours=1), 120, current_alpha)
    with engine.begin() as conn:
        conn.execute(insert(ScrapeIntervalRow), rows)


def scraped(run: object) -> list[object]:
    return [r for r in run.results if r.metric == "acceptance_rate_intervals"]  # type: ignore[attr-defined]


def test_a_drop_of_a_scraped_series_is_found_and_alerted(engine: Engine) -> None:
    store(engine, current_alpha=0.60, seed=1)
    config = AlertConfig(AlertSettings())
    for minutes in (0, 5):
        run = run_drift(engine, None, NOW + timedelta(minutes=minutes), detectors=False)
        evaluate_alerts(engine, config, run.results, now=NOW + timedelta(minutes=minutes))
    (result,) = scraped(run)
    assert (result.decision, result.workload, result.pair) == ("drift", "chat", "llama-8b/eagle@vllm-a")
    assert result.effect == pytest.approx(-0.10, abs=0.02) and result.detail["unit"] == "interval"
    (alert,) = [a for a in list_alerts(engine) if a.rule == "acceptance_drop"]
    assert (alert.state, alert.labels["pair"]) == ("firing", "llama-8b/eagle@vllm-a")


def test_an_unchanged_scraped_series_is_quiet(engine: Engine) -> None:
    store(engine, current_alpha=0.70, seed=2)
    (result,) = scraped(run_drift(engine, None, NOW, detectors=False))
    # An interval belongs to the window its end falls in: the last reference one ends where the current starts.
    assert result.decision == "no_drift" and (result.n_ref, result.n_cur) == (2879, 120)


def test_the_interval_test_is_calibrated_on_simulated_intervals() -> None:
    # 300 seeded A/A comparisons (120 current against 720 reference intervals): the raw p-value is
    # uniform, so about 1 % fall below 0.01; with the 5-point floor none is called drift. Bounds at
    # 3 % leave room for this seed set's noise (P(X > 9) under Binomial(300, 0.01) is below 0.1 %).
    test = IntervalAcceptanceDrift(n_boot=20)
    below, drifted = 0, 0
    for seed in range(300):
        rng = np.random.default_rng(seed)
        ref = np.array([r["accepted_tokens"] / r["draft_tokens"] for r in simulated(rng, NOW, 720, 0.7)])  # type: ignore[operator]
        cur = np.array([r["accepted_tokens"] / r["draft_tokens"] for r in simulated(rng, NOW, 120, 0.7)])  # type: ignore[operator]
        result = test.compare(ref, cur)
        below += result.p is not None and result.p < 0.01
        drifted += result.p is not None and result.p < 0.01 and result.passes_floor
    assert below <= 9 and drifted == 0
