"""Load, not speculation: a baseline that ran at a lower concurrency must not make a net loss.

A replica's ms per token grows with the requests it batches. Under ``proxy.baseline_policy =
share`` the baseline replica gets a small share of the traffic, so it decodes them nearly alone
(``upstream_inflight`` 1) while the speculative replica batches 8 at a time. Here ms per token
depends on load only: at equal load speculation ties plain decoding, so whatever the comparison
finds is the load difference. The stratified verdict sees that no speculative request has plain
company at its load level and says ``inconclusive`` ("strata do not overlap"); the same requests
compared without their loads show a 0.42x "speedup" with q far below the level: a false net loss.

Measured over seeds 0-199 (``test_over_200_seeds...``, the same data as the single-seed tests):
the stratified verdict's false-alarm rate is 0/200 (every seed inconclusive), the unstratified
comparison's 200/200. At matched load (the ``member`` policy's situation) the stratified test
raised 4 of 200 on a tie: the rank test's own rate at the 0.01 level (2 expected, 4 or more has a
chance of about 14 %).
"""

from __future__ import annotations

import numpy as np
import pytest

from monitor.drift.detectors.net_loss import NetLoss, Population
from monitor.drift.result import DriftResult, apply_bh
from monitor.drift.stats import FloatArray
from monitor.drift.verdict import verdict_of

LEVEL = 0.01  # drift.fdr_level's default
N_SPEC, N_PLAIN = 200, 40  # a 1 h window of a workload with a 20 % holdout share, roughly
SPEC_LOAD, PLAIN_LOAD = 8, 1


def ms_per_token(rng: np.random.Generator, load: FloatArray) -> FloatArray:
    # Each request batched with others costs its replica about a fifth of a pass more per step.
    cost: FloatArray = 12.0 * (1 + 0.2 * (load - 1)) * rng.lognormal(0.0, 0.1, len(load))
    return cost


def traffic(seed: int, plain_load: float = PLAIN_LOAD) -> tuple[Population, Population]:
    """The speculative requests, then the holdout's."""
    rng = np.random.default_rng(seed)
    spec_load, hold_load = np.full(N_SPEC, float(SPEC_LOAD)), np.full(N_PLAIN, float(plain_load))
    spec_ms, spec_ctx = ms_per_token(rng, spec_load), rng.integers(100, 600, N_SPEC).astype(float)
    hold_ms, hold_ctx = ms_per_token(rng, hold_load), rng.integers(100, 600, N_PLAIN).astype(float)
    return Population(spec_ms, spec_ctx, spec_load), Population(hold_ms, hold_ctx, hold_load)


def decide(data: tuple[Population, Population], *, with_loads: bool) -> DriftResult:
    spec, holdout = data if with_loads else (p._replace(load=None) for p in data)
    # One result in the run, so BH's q is its p: the decision the drift run would store.
    (result,) = apply_bh([NetLoss(n_boot=200).measured(spec, holdout)], level=LEVEL)
    return result.replace(workload="chat")


def test_a_baseline_at_lower_load_gives_no_net_loss() -> None:
    result = decide(traffic(0), with_loads=True)
    verdict = verdict_of(result)
    assert result.decision == "insufficient_data" and verdict.verdict == "inconclusive", verdict
    assert verdict.reason.startswith("strata do not overlap"), verdict.reason
    assert result.detail["coverage"] == 0.0


def test_the_same_requests_without_their_loads_would_be_a_net_loss() -> None:
    result = decide(traffic(0), with_loads=False)
    assert result.decision == "drift" and verdict_of(result).verdict == "net_loss"
    # The load ratio (12 ms at 1 against 12 x 2.4 at 8), taken for speculation's cost.
    assert result.effect == pytest.approx(1 / 2.4, rel=0.05)


def test_at_equal_load_the_tie_is_measured_as_one() -> None:
    result = decide(traffic(0, plain_load=SPEC_LOAD), with_loads=True)
    assert result.decision == "no_drift" and verdict_of(result).verdict == "inconclusive"
    assert result.effect == pytest.approx(1.0, rel=0.05)
    assert result.ci is not None and result.ci[0] < 1 < result.ci[1]


def test_over_200_seeds_the_stratified_verdict_never_calls_a_net_loss() -> None:
    stratified = unstratified = matched = 0
    for seed in range(200):
        data = traffic(seed)
        stratified += decide(data, with_loads=True).decision == "drift"
        unstratified += decide(data, with_loads=False).decision == "drift"
        matched += decide(traffic(seed, plain_load=SPEC_LOAD), with_loads=True).decision == "drift"
    assert (stratified, unstratified) == (0, 200)
    # A tie alarms at most at the level: about 2 of 200 by chance at 0.01; 6 would be a broken test.
    assert matched <= 6
