"""Each drift test on seeded data: quiet under A/A, finds an injected change, insufficient data
below the minimum, effect floors respected; BH across a run; false-alarm rates near nominal."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.drift.detectors.acceptance import AcceptanceDrift
from monitor.drift.detectors.latency import LatencyRegression
from monitor.drift.detectors.net_loss import NetLoss, Population
from monitor.drift.detectors.page_hinkley import PageHinkley
from monitor.drift.detectors.prompt_length import PromptLengthShift
from monitor.drift.detectors.traffic_mix import TrafficMixDrift
from monitor.drift.result import DriftResult, apply_bh, benjamini_hochberg

LEVEL = 0.01


def decide(result: DriftResult) -> str:
    return apply_bh([result], LEVEL)[0].decision


def acceptance(rng: np.random.Generator, mean: float, n: int) -> np.ndarray:
    return rng.beta(mean * 8, (1 - mean) * 8, n)


def test_acceptance_aa_change_minimum_and_floor() -> None:
    rng = np.random.default_rng(10)
    test = AcceptanceDrift()
    assert decide(test.compare(acceptance(rng, 0.6, 300), acceptance(rng, 0.6, 300))) == "no_drift"
    dropped = test.compare(acceptance(rng, 0.6, 300), acceptance(rng, 0.5, 300))
    assert decide(dropped) == "drift" and dropped.ci[1] < 0  # type: ignore[index]
    assert test.compare(acceptance(rng, 0.6, 29), acceptance(rng, 0.5, 300)).decision == "insufficient_data"
    # A 3-point drop over 5000 requests is significant, but below the 5-point floor: no drift.
    small = test.compare(acceptance(rng, 0.6, 5000), acceptance(rng, 0.57, 5000))
    assert small.p is not None and small.p < 1e-6 and not small.passes_floor and decide(small) == "no_drift"
    assert decide(AcceptanceDrift(floor=0.02).compare(acceptance(rng, 0.6, 5000), acceptance(rng, 0.57, 5000))) == (
        "drift"
    )


def test_latency_one_sided_with_p95_floor() -> None:
    rng = np.random.default_rng(12)
    test = LatencyRegression("ms_per_token")
    ref = rng.lognormal(3, 0.3, 400)
    assert decide(test.compare(ref, rng.lognormal(3, 0.3, 400))) == "no_drift"
    slower = test.compare(ref, rng.lognormal(3, 0.3, 400) * 1.5)
    assert decide(slower) == "drift" and slower.ci[0] > 1.2  # type: ignore[index]
    # Faster is not a regression (one-sided).
    assert decide(test.compare(ref, rng.lognormal(3, 0.3, 400) * 0.6)) == "no_drift"
    # +5 % over many requests: significant, under the +10 % floor.
    small = test.compare(rng.lognormal(3, 0.3, 5000), rng.lognormal(3, 0.3, 5000) * 1.05)
    assert small.p is not None and small.p < 1e-6 and decide(small) == "no_drift"
    assert test.compare(ref[:5], ref).decision == "insufficient_data"


def test_traffic_mix_and_prompt_length() -> None:
    mix = TrafficMixDrift()
    assert decide(mix.compare({"a": 500, "b": 500, "c": 2}, {"a": 510, "b": 490, "c": 1})) == "no_drift"
    assert decide(mix.compare({"a": 500, "b": 500}, {"a": 850, "b": 150})) == "drift"
    assert mix.compare({"a": 10}, {"a": 10}).decision == "insufficient_data"
    rng = np.random.default_rng(13)
    prompt = PromptLengthShift()
    assert decide(prompt.compare(rng.poisson(100, 400), rng.poisson(100, 400))) == "no_drift"
    assert decide(prompt.compare(rng.poisson(100, 400), rng.poisson(300, 400))) == "drift"


def test_net_loss_needs_the_upper_bound_below_one() -> None:
    rng = np.random.default_rng(14)
    test = NetLoss()

    def ctx(n: int) -> np.ndarray:
        return rng.integers(50, 500, n).astype(float)

    def requests(mu: float, n: int) -> Population:
        return Population(rng.lognormal(mu, 0.2, n), ctx(n))

    slower = test.measured(requests(3.3, 400), requests(3.0, 100))
    assert slower.effect < 1 and slower.ci[1] < 1 and decide(slower) == "drift"  # type: ignore[index,operator]
    faster = test.measured(requests(2.7, 400), requests(3.0, 100))
    assert faster.effect > 1 and decide(faster) == "no_drift"  # type: ignore[operator]
    few = test.measured(requests(3, 400), requests(3, 5))
    assert few.decision == "insufficient_data"
    # Estimate: flagged, no p-value, decided by the interval alone.
    est = test.estimated(requests(3.3, 400), requests(3.0, 100))
    assert est.p is None and est.detail["estimate"] and est.decision == "drift" and est.ci[1] < 1  # type: ignore[index]


def test_page_hinkley_persists_and_fires_on_a_drop() -> None:
    rng = np.random.default_rng(15)
    ph = PageHinkley()
    assert not ph.update_many(rng.normal(0.7, 0.2, 1500))
    restored = PageHinkley.from_state(ph.state())
    assert restored.state() == ph.state()
    assert restored.update_many(rng.normal(0.5, 0.2, 300)) and restored.direction == "down"
    with pytest.raises(AttributeError):
        restored.drift_detected = False  # type: ignore[misc]


def test_benjamini_hochberg_matches_the_definition() -> None:
    p = [0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205, 0.212, 0.216]
    q = benjamini_hochberg(p)
    m = len(p)
    expected = [min(min(p[j] * m / (j + 1) for j in range(i, m)), 1.0) for i in range(m)]
    assert np.allclose(q, expected)
    results = [
        DriftResult(
            test="t",
            metric="m",
            n_ref=100,
            n_cur=100,
            statistic=1.0,
            p=pv,
            effect=1.0,
            ci=(0.0, 2.0),
            decision="no_drift",
            passes_floor=True,
        )
        for pv in p
    ]
    decided = apply_bh(results, 0.05)
    # Unadjusted, five p-values are below 0.05; after BH only the first two are discoveries.
    assert [r.decision for r in decided].count("drift") == 2
    assert all(r.q is not None and r.q >= r.p for r in decided)  # type: ignore[operator]


def test_aa_false_alarm_rate_is_near_nominal() -> None:
    """300 A/A comparisons at 50 requests per window: the MWU rejection rate at 5 % stays near 5 %."""
    rng = np.random.default_rng(16)
    test = AcceptanceDrift(n_boot=50)
    rejections = sum(
        (test.compare(acceptance(rng, 0.6, 50), acceptance(rng, 0.6, 50)).p or 1.0) < 0.05 for _ in range(300)
    )
    # Binomial(300, 0.05): mean 15, sd 3.8; allow ~3 sd.
    assert 3 <= rejections <= 27
