"""Net loss on records whose true speedup is known by construction (tests/drift/costs.py).

A drafter that proposes random tokens loses, with an n-gram's cost profile (~0.88x) and with a
model's (~0.44x): the drift run must say so from holdout when the workload has enough, and from
the target's plain decoding when it has not. Where speculation pays, it must say nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.engine import Engine

from monitor.drift.detectors.net_loss import NetLoss, Population, Strata
from monitor.drift.result import DriftResult, apply_bh
from monitor.drift.run import run_drift
from monitor.store import migrate
from monitor.store.engine import create_engine
from tests.drift.conftest import store
from tests.drift.costs import GOOD_NGRAM, RANDOM_MODEL, RANDOM_NGRAM, Profile, cost_stream

T0 = datetime(2026, 3, 1, tzinfo=UTC)
CUR = T0 + timedelta(hours=6)
NOW = CUR + timedelta(hours=1)
PER_WINDOW = 200  # requests in the current window (1 h); the 6 h reference holds 6x as many


def net_loss(engine: Engine, profile: Profile, holdout: float, seed: int = 0) -> DriftResult:
    records = cost_stream(profile, T0, CUR, 6 * PER_WINDOW, workload="extract", holdout=holdout, seed=seed)
    records += cost_stream(profile, CUR, NOW, PER_WINDOW, workload="extract", holdout=holdout, seed=seed + 1)
    store(engine, records)
    run = run_drift(engine, None, NOW, current=timedelta(hours=1), reference=timedelta(hours=6), seed=seed)
    (result,) = [r for r in run.results if r.test == "net_loss"]
    return result


def test_the_profiles_mean_what_they_say() -> None:
    assert RANDOM_NGRAM.expected_speedup() == pytest.approx(0.88, abs=0.01)
    assert RANDOM_MODEL.expected_speedup() == pytest.approx(0.44, abs=0.01)
    assert GOOD_NGRAM.expected_speedup() > 2


@pytest.mark.parametrize("profile", [RANDOM_NGRAM, RANDOM_MODEL], ids=lambda p: p.name)
def test_a_losing_drafter_is_found_from_holdout(engine: Engine, profile: Profile) -> None:
    result = net_loss(engine, profile, holdout=0.2)
    assert "estimate" not in result.detail and result.p is not None
    assert result.decision == "drift", result
    assert result.effect == pytest.approx(profile.expected_speedup(), rel=0.06)
    assert result.ci is not None and result.ci[0] < profile.expected_speedup() < result.ci[1]


@pytest.mark.parametrize("profile", [RANDOM_NGRAM, RANDOM_MODEL], ids=lambda p: p.name)
def test_a_losing_drafter_is_found_from_the_targets_plain_decoding(engine: Engine, profile: Profile) -> None:
    # 5 % holdout: ~10 holdout requests in the hour, too few to measure; the 6 h before hold ~60.
    result = net_loss(engine, profile, holdout=0.05)
    assert result.detail.get("estimate") is True and result.p is None
    assert result.decision == "drift", result
    assert result.effect == pytest.approx(profile.expected_speedup(), rel=0.06)


def test_no_net_loss_where_speculation_pays_in_20_seeded_runs(tmp_path: Path) -> None:
    found = []
    for seed in range(20):
        engine = create_engine(f"sqlite:///{tmp_path / f'aa-{seed}.db'}")
        migrate.upgrade(engine)
        result = net_loss(engine, GOOD_NGRAM, holdout=0.05 if seed % 2 else 0.2, seed=seed)
        assert result.decision != "insufficient_data"
        found += [seed] if result.decision == "drift" else []
        engine.dispose()
    assert found == []


def test_under_equal_speed_the_measured_form_alarms_at_most_at_its_level() -> None:
    """Null exactly at the boundary (speculation neither faster nor slower): 400 seeded comparisons.

    The van Elteren p-value is uniform under the null, so at the run's level 0.01 about 4 of 400
    would alarm by chance; the interval rule can only remove alarms. Allowing 10 keeps the test's
    own false-failure chance below 0.1 % (binomial tail), while a test that ignored strata or ties
    would exceed it.
    """
    test = NetLoss(n_boot=200)
    alarms = 0
    for seed in range(400):
        rng = np.random.default_rng(seed)
        ctx_spec, ctx_hold = rng.integers(50, 700, 200), rng.integers(50, 700, 40)
        spec = 20 * (1 + ctx_spec / 2000) * rng.lognormal(0, 0.15, 200)
        hold = 20 * (1 + ctx_hold / 2000) * rng.lognormal(0, 0.15, 40)
        result = apply_bh([test.measured(Population(spec, ctx_spec), Population(hold, ctx_hold))], level=0.01)[0]
        alarms += result.decision == "drift"
    assert alarms <= 10


def test_strata_remove_a_length_mix_difference() -> None:
    """Holdout requests with longer contexts cost more per token; the raw ratio would call that a gain."""
    rng = np.random.default_rng(3)
    ctx_spec = rng.integers(50, 300, 300)
    # Most holdout requests are long ones; a few are far longer than any speculative request.
    ctx_hold = np.concatenate([rng.integers(240, 300, 45), rng.integers(50, 240, 15), rng.integers(3000, 4000, 10)])

    def cost(ctx: np.ndarray) -> np.ndarray:
        return 10 * (1 + ctx / 100) * rng.lognormal(0, 0.05, len(ctx))

    spec, hold = cost(ctx_spec) / 1.25, cost(ctx_hold)  # speculation 1.25x faster at every length
    result = NetLoss().measured(Population(spec, ctx_spec), Population(hold, ctx_hold))
    assert result.effect == pytest.approx(1.25, rel=0.04)
    assert (result.n_ref, result.detail["strata"]) == (60, 4)  # the 10 out-of-range ones left out
    assert float(np.mean(hold) / np.mean(spec)) > 2.5  # unstratified, length passes for speed


def thin_holdout(seed: int, slower: float, *, n_hold: int = 30) -> tuple[Population, Population]:
    """200 speculative requests at lengths 100-300 and ``n_hold`` holdout requests, all short or a few far longer:
    the context strata leave fewer than 30 of them, though the workload has its 30."""
    rng = np.random.default_rng(seed)
    ctx_spec = rng.integers(100, 300, 200).astype(float)
    if seed % 2:  # all in the shortest third: the longer speculative strata find none
        ctx_hold = rng.integers(100, 160, n_hold).astype(float)
    else:  # three far longer than any speculative request: outside the support
        ctx_hold = np.concatenate([rng.integers(100, 300, n_hold - 3), rng.integers(1000, 1200, 3)]).astype(float)
    spec = 20 * slower * rng.lognormal(0, 0.15, 200)
    hold = 20 * rng.lognormal(0, 0.15, n_hold)
    return Population(spec, ctx_spec, np.ones(200)), Population(hold, ctx_hold, np.ones(n_hold))


def test_a_workload_with_just_enough_holdout_is_measured_on_coarser_strata_not_given_up() -> None:
    """Before, the strata trimming took such a workload below 30 holdout requests: no measurement, a pooled estimate."""
    for seed, grain in ((1, "load"), (2, "load, every context length")):
        spec, hold = thin_holdout(seed, slower=1.0)
        assert sum(len(b) for b in Strata.split(spec, hold).plain) < 30 or Strata.split(spec, hold).coverage < 0.5
        result = NetLoss().measured(spec, hold)
        assert result.decision != "insufficient_data", result
        assert (result.detail["stratified_by"], result.n_ref) == (grain, 30)


def test_a_clear_loss_with_32_holdout_requests_is_called_in_every_seeded_run() -> None:
    """A 0.38x loss with 32 requests a side was missed in one of two runs (issue 51): 20 seeds, all called."""
    missed = []
    for seed in range(20):
        spec, hold = thin_holdout(seed, slower=1 / 0.38, n_hold=32)
        result = apply_bh([NetLoss(n_boot=200).measured(spec, hold)], level=0.01)[0]
        missed += [] if result.decision == "drift" else [seed]
    assert missed == []


def test_under_equal_speed_the_coarser_strata_alarm_at_most_at_their_level() -> None:
    """400 seeded null comparisons on thin holdouts: at level 0.01 about 4 alarm by chance; at most 10 allowed
    (the test's own false-failure chance below 0.1 %, binomial tail), as for the finest strata above."""
    test = NetLoss(n_boot=200)
    alarms = sum(
        apply_bh([test.measured(*thin_holdout(seed, slower=1.0))], level=0.01)[0].decision == "drift"
        for seed in range(400)
    )
    assert alarms <= 10


def test_the_interval_covers_a_ratio_of_skewed_bimodal_means_at_30_a_side() -> None:
    """A/A on speeds like the measured ``extract`` requests: most near 22 ms a token (n-gram drafts), a fifth near
    56 (the controller's probes of a draft model), 30 a side, both sides drawn from one pool (true ratio 1).

    The 95 % interval misses the true 1 in 4.0 % of these 800 seeded draws (2.1 % below, 1.9 % above); the percentile
    interval it replaced missed in 7.6 % (3.6 % below, 4.0 % above): too narrow where the skew points. At exactly
    its nominal 5 % an interval would exceed the 6 % bound in about one seed in ten.
    """
    rng = np.random.default_rng(11)
    pool = np.where(rng.random(50) < 0.2, rng.lognormal(np.log(56), 0.1, 50), rng.lognormal(np.log(22), 0.15, 50))
    ctx = rng.integers(100, 500, 50).astype(float)
    test = NetLoss(n_boot=500)
    missed = 0
    for _ in range(800):
        a, b = rng.integers(0, 50, 30), rng.integers(0, 50, 30)
        result = test.measured(Population(pool[a], ctx[a]), Population(pool[b], ctx[b]))
        assert result.ci is not None
        missed += not result.ci[0] <= 1.0 <= result.ci[1]
    assert missed / 800 <= 0.06, missed
