"""The split of decode time per token (issue 50, item 6): the same exact split as acceptance's, over decode
ms and decode tokens, its Level 2 with the load and the requests' acceptance besides the six groups; named
when staged, silent in A/A; and in a drift run, stored, served and said in the latency result."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.engine import Engine

from monitor.drift.explain import DECODE_SPEED, Stratum, explain, sentence
from monitor.drift.explain_factors import SPEED_GROUPS, RequestFactors, Requests, label_requests, split_within
from monitor.drift.queries import latest_run
from monitor.drift.run import explain_drift, run_drift
from tests.alerting import make_settings
from tests.drift.conftest import store
from tests.drift.records import window_stream
from tests.drift.test_explain import CUR, NOW, T0

BASE = RequestFactors(200, 60, 0.0, 1.0, 4, "aaaa", 0.05, "model", "m", "d1", "t1", "r1")


def window(rng: np.random.Generator, n: int, inflight: list[int], acceptance: float) -> Requests:
    """``n`` requests: each waits behind a batch of ``inflight`` requests (chosen at random among those given),
    accepts around ``acceptance``; a token costs 20 ms, 8 % more per request in flight, less the more is accepted."""
    load = rng.choice(inflight, n)
    accepted_share = rng.beta(acceptance * 10, (1 - acceptance) * 10, n)
    tokens = rng.integers(20, 80, n).astype(float)
    per_token = 20.0 * (1 + 0.08 * (load - 1)) * (1.6 - accepted_share) * rng.lognormal(0.0, 0.15, n)
    rows = [
        BASE._replace(upstream_inflight=int(k), accepted=int(40 * a), drafted=40)
        for k, a in zip(load, accepted_share, strict=True)
    ]
    return label_requests(tokens, per_token * tokens, rows, SPEED_GROUPS, bounded=False)


def split(ref: Requests, cur: Requests, seed: int = 0) -> set[str]:
    parts = split_within((ref, cur), "code", 1.0, min_requests=30, n_boot=300, seed=seed, fdr_level=0.01, floor=0.3)
    return {p.cause for p in parts if p.named}


def test_a_load_shift_is_named_load() -> None:
    rng = np.random.default_rng(1)
    assert split(window(rng, 600, [1, 2], 0.6), window(rng, 600, [8, 12], 0.6)) == {"load"}


def test_an_acceptance_drop_is_named_acceptance() -> None:
    rng = np.random.default_rng(2)
    assert split(window(rng, 600, [1, 2], 0.8), window(rng, 600, [1, 2], 0.2)) == {"acceptance"}


def test_aa_names_nothing() -> None:
    # 20 seeded A/A pairs; at q < 0.01 with the floor, the chance that any names a part is well under 1 in 20.
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        assert split(window(rng, 400, [1, 2, 4], 0.6), window(rng, 400, [1, 2, 4], 0.6), seed) == set()


def test_level_1_splits_decode_ms_over_tokens_exactly() -> None:
    rng = np.random.default_rng(3)

    def stratum(window: int, cell: str, ms: float, n: int) -> Stratum:
        tokens = rng.integers(20, 80, n).astype(float)
        return Stratum(window, cell, tokens, tokens * ms * rng.lognormal(0.0, 0.1, n))

    strata = [stratum(0, "chat", 20, 500), stratum(0, "code", 30, 500), stratum(1, "chat", 20, 500)]
    strata.append(stratum(1, "code", 45, 500))
    e = explain(strata, min_requests=30, n_boot=300, seed=1, fdr_level=0.01, metric=DECODE_SPEED)
    assert abs(sum(p.value for p in e.parts) - (e.change or 0)) < 1e-9
    assert {(p.cause, p.workload) for p in e.named} == {("within", "code")}
    # The floor is relative: 1 % of the reference's ms per token, here about 0.25 ms.
    assert e.rate_ref is not None and e.floor == pytest.approx(0.01 * e.rate_ref)
    said = sentence(e)
    assert said.startswith("Decode time per token rose ") and " ms (" in said and "within code (" in said


def test_a_drift_run_splits_decode_speed_and_the_latency_result_says_it(engine: Engine, tmp_path: Path) -> None:
    # Code's tokens cost twice as much in the last hour, its requests sent behind a batch of ten; chat stays.
    records = window_stream(T0, CUR, 300, workload="code", alpha=0.6, answer_tokens=60)
    records += window_stream(T0, CUR, 300, workload="chat", alpha=0.6, seed=2, answer_tokens=60)
    records += window_stream(CUR, NOW, 300, workload="chat", alpha=0.6, seed=3, answer_tokens=60)
    busy = window_stream(CUR, NOW, 300, workload="code", alpha=0.6, seed=1, answer_tokens=60, ms_per_token=40.0)
    records = [dataclasses.replace(r, upstream_inflight=1) for r in records]
    records += [dataclasses.replace(r, upstream_inflight=10) for r in busy]
    store(engine, records)
    settings = make_settings(tmp_path, engine.url.render_as_string(hide_password=False))
    run = run_drift(engine, settings.drift, NOW, current=timedelta(hours=1), reference=timedelta(hours=24))
    speed = run.speed
    assert speed is not None and speed.change is not None and speed.change > 5
    # Load alone: not the groups that fragment code's requests into thin cells (length, acceptance), which
    # took parts back while thin cells of both loads were thrown into one.
    assert {(p.cause, p.workload) for p in speed.named} == {("load", "code")}
    load = next(p for p in speed.parts if p.cause == "load")
    assert load.value == pytest.approx(load.detail["within"]["value"], rel=0.05)
    assert load.detail["lead"] == "in flight 8-15" and load.detail["within"]["named"]
    # The acceptance split is untouched by it: acceptance did not move.
    assert run.explanation is not None and not run.explanation.named
    (latency,) = [r for r in run.results if r.metric == "ms_per_token" and r.workload == "code"]
    assert latency.detail["explanation"] == sentence(speed)
    assert "from load (in flight 8-15 0 % -> 100 % of decode tokens" in sentence(speed)
    stored = latest_run(engine)
    assert stored is not None and stored.speed_split == run.speed_json()
    _, again = explain_drift(engine, settings.drift, NOW, current=timedelta(hours=1), metric=DECODE_SPEED)
    assert again.to_json() == speed.to_json()
