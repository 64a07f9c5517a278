"""Latency regression: is the current window slower than the reference?

Metrics, per request: milliseconds per output token, time to first token, end-to-end latency.
Test: Mann–Whitney U, one-sided (current stochastically larger than reference): only a slowdown
is a regression. Effect: ratio of the 95th percentiles, current over reference, with a bootstrap
interval; the ratio of medians and its interval go in ``detail``. Floor: p95 ratio at least
1 + ``floor`` (default +10 %).

Error rates: under no change P(p < a) = a (asymptotic normal approximation); the p95 floor lowers
the false-alarm rate further. Percentile intervals of p95 from n requests rest on about 0.05 n
tail values: below roughly 100 requests per window they are wide, which the interval shows.

>>> rng = np.random.default_rng(3)
>>> ref, cur = rng.lognormal(3.0, 0.3, 300), rng.lognormal(3.0, 0.3, 300) * 1.3
>>> r = LatencyRegression("ms_per_token", seed=3).compare(ref, cur)
>>> r.p < 1e-6, round(r.effect, 2), r.passes_floor, r.ci[0] > 1
(True, 1.22, True, True)
"""

from __future__ import annotations

import numpy as np
from scipy import stats as st

from monitor.drift.detectors.windowed import WindowedTest
from monitor.drift.result import DriftResult
from monitor.drift.stats import FloatArray, quantile_ratio

METRICS = ("ms_per_token", "ttft_ms", "latency_ms")


class LatencyRegression(WindowedTest):
    """One-sided Mann–Whitney U on a latency metric; effect = p95 ratio (p50 ratio in detail) with CIs."""

    test = "latency"
    default_floor = 0.1

    def __init__(
        self,
        metric: str = "ms_per_token",
        *,
        floor: float | None = None,
        min_requests: int = 30,
        n_boot: int = 500,
        ci_level: float = 0.95,
        seed: int = 0,
    ) -> None:
        super().__init__(floor=floor, min_requests=min_requests, n_boot=n_boot, ci_level=ci_level)
        self.metric = metric
        self.seed = seed

    def compare(self, ref: FloatArray, cur: FloatArray) -> DriftResult:
        ref, cur = np.asarray(ref, dtype=float), np.asarray(cur, dtype=float)
        if (too_few := self.too_few(len(ref), len(cur))) is not None:
            return too_few
        u = st.mannwhitneyu(cur, ref, alternative="greater", method="asymptotic")
        rng = np.random.default_rng(self.seed)
        p95, ci95 = quantile_ratio(ref, cur, 0.95, self.n_boot, self.ci_level, rng)
        p50, ci50 = quantile_ratio(ref, cur, 0.50, self.n_boot, self.ci_level, rng)
        return DriftResult(
            test=self.test,
            metric=self.metric,
            n_ref=len(ref),
            n_cur=len(cur),
            statistic=float(u.statistic),
            p=float(u.pvalue),
            effect=p95,
            ci=ci95,
            decision="no_drift",
            passes_floor=p95 >= 1.0 + self.floor,
            detail={
                "p50_ratio": p50,
                "p50_ratio_ci": list(ci50),
                "p95_ref": float(np.quantile(ref, 0.95)),
                "p95_cur": float(np.quantile(cur, 0.95)),
            },
        )
