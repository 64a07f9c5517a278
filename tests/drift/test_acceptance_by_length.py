"""Acceptance within a prompt-length bucket: seeded A/A calibration and false alarms under BH, power
for a change confined to one bucket (which the overall acceptance test misses), and a stored run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
from sqlalchemy.engine import Engine

from monitor.drift.detectors.acceptance import AcceptanceDrift
from monitor.drift.detectors.acceptance_by_length import AcceptanceByLength, acceptance_by_length
from monitor.drift.result import DriftResult, apply_bh
from monitor.drift.run import run_drift
from tests.drift.conftest import store
from tests.drift.records import window_stream

LEVEL = 0.01
N = 200  # requests per window
PROMPTS = np.array([100, 500, 2000, 6000])  # one prompt length in each bucket
SHARES = np.array([0.4, 0.3, 0.2, 0.1])
MEANS = np.array([0.75, 0.65, 0.55, 0.45])  # acceptance falls with prompt length
CONCENTRATION = 8.0


def window(rng: np.random.Generator, drop: float = 0.0, bucket: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Prompt lengths and per-request acceptance of one window; ``drop`` lowers one bucket's mean."""
    which = rng.choice(len(PROMPTS), N, p=SHARES)
    means = MEANS[which] - np.where(which == bucket, drop, 0.0)
    return PROMPTS[which].astype(float), rng.beta(means * CONCENTRATION, (1 - means) * CONCENTRATION)


def one_run(seed: int, drop: float = 0.0) -> tuple[list[DriftResult], DriftResult]:
    """The bucket tests and the overall acceptance test of one seeded comparison, BH over the buckets."""
    rng = np.random.default_rng(seed)
    (ref_p, ref_a), (cur_p, cur_a) = window(rng), window(rng, drop)
    buckets = apply_bh(acceptance_by_length(ref_p, ref_a, cur_p, cur_a), LEVEL)
    overall = apply_bh([AcceptanceDrift().compare(ref_a, cur_a)], LEVEL)[0]
    return buckets, overall


def test_aa_p_values_are_uniform_and_runs_stay_quiet() -> None:
    runs = [one_run(seed) for seed in range(300)]
    p = np.array([r.p for buckets, _ in runs for r in buckets if r.p is not None])
    assert len(p) > 800  # the 4,096+ bucket (10 %) is below the minimum in some windows
    assert 0.035 < (p < 0.05).mean() < 0.065
    assert (p < 0.01).mean() < 0.02
    assert 0.45 < p.mean() < 0.55
    alarms = sum(any(r.decision == "drift" for r in buckets) for buckets, _ in runs)
    assert alarms <= 6  # measured 3 of these 300 (32 of 3,000 seeds: 1.1 %, the level 0.01)


def test_a_drop_in_one_bucket_is_found_where_the_overall_test_misses_it() -> None:
    runs = [one_run(seed, drop=0.20) for seed in range(60)]
    found = [
        {r.metric for r in buckets if r.decision == "drift"} == {"acceptance_rate[prompt 1024-4096]"}
        for buckets, _ in runs
    ]
    assert sum(found) >= 50  # measured 96 % over 200 seeds
    # The workload's own test sees a 2-4 point drop, mostly below its floor (measured 18 % over 200 seeds).
    assert sum(overall.decision == "drift" for _, overall in runs) <= 20


def test_too_few_requests_one_bucket_and_the_bucket_range() -> None:
    rng = np.random.default_rng(4)
    rates = rng.beta(6, 4, 100)
    short, long = np.full(100, 100.0), np.where(np.arange(100) < 90, 100.0, 2000.0)
    assert acceptance_by_length(short, rates, short, rates) == []  # one bucket: the acceptance test covers it
    found = acceptance_by_length(long, rates, long, rates)
    assert [(r.metric, r.decision) for r in found] == [
        ("acceptance_rate[prompt 0-256]", "no_drift"),
        ("acceptance_rate[prompt 1024-4096]", "insufficient_data"),
    ]
    assert found[0].detail["prompt_tokens"] == [0, 256]
    assert AcceptanceByLength(3).compare(rates, rates).detail["prompt_tokens"] == [4096, None]
    try:
        AcceptanceByLength(4)
    except ValueError as error:
        assert "got 4" in str(error)
    else:
        raise AssertionError("bucket 4 was accepted")


T0 = datetime(2026, 3, 1, tzinfo=UTC)
CUR = T0 + timedelta(hours=24)
NOW = T0 + timedelta(hours=25)


def test_a_run_finds_the_long_prompts_drop(engine: Engine) -> None:
    # Short and long prompts of one workload; in the current window only the long ones accept less.
    records = []
    for prompt, alpha, cur_alpha, seed in ((120, 0.8, 0.8, 0), (2000, 0.7, 0.45, 10)):
        records += window_stream(T0, CUR, 150, workload="rag", alpha=alpha, prompt_tokens=prompt, seed=seed)
        records += window_stream(CUR, NOW, 150, workload="rag", alpha=cur_alpha, prompt_tokens=prompt, seed=seed + 1)
    store(engine, records)
    run = run_drift(engine, None, NOW, current=timedelta(hours=1), reference=timedelta(hours=24))
    by_metric = {r.metric: r for r in run.results if r.test == "acceptance_by_length"}
    assert set(by_metric) == {"acceptance_rate[prompt 0-256]", "acceptance_rate[prompt 1024-4096]"}
    long = by_metric["acceptance_rate[prompt 1024-4096]"]
    assert long.decision == "drift" and long.effect is not None and long.effect < -0.2
    assert (long.n_ref, long.n_cur, long.workload) == (150, 150, "rag") and long.q is not None
    assert by_metric["acceptance_rate[prompt 0-256]"].decision == "no_drift"
