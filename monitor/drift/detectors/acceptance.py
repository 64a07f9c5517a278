"""Acceptance drift: per-request acceptance rates, reference window against current window.

The unit is the request: each request contributes one number, accepted / drafted draft tokens.
Tokens of one request share a prompt, a topic and a drafter state, so they are not independent
draws; a token-level binomial test would count a 500-token request as 500 pieces of evidence and
report certainty it does not have (see docs/statistics.md).

Test: Mann–Whitney U, two-sided (rank-based: per-request rates are bounded, skewed and often tied
at 0 or 1). Effect: difference of mean acceptance, current minus reference, with a percentile
bootstrap interval. The effect floor (default 5 points) is on the absolute difference.

Error rates: under no change, P(p < a) = a (asymptotic normal approximation with tie correction,
accurate from about 20 requests per window); the floor only lowers the false-alarm rate further.
In the simulation of ``benchmarks/drift_quality.py`` a 10-point drop is found with power ≥ 0.99 at
200 requests per window.

>>> rng = np.random.default_rng(1)
>>> ref, cur = rng.beta(7, 3, 200), rng.beta(6, 4, 200)   # mean 0.70 -> 0.60
>>> r = AcceptanceDrift().compare(ref, cur)
>>> round(r.effect, 3), r.p < 1e-4, r.passes_floor
(-0.128, True, True)
>>> AcceptanceDrift().compare(ref[:10], cur).decision
'insufficient_data'
"""

from __future__ import annotations

import numpy as np
from scipy import stats as st

from monitor.drift.detectors.windowed import WindowedTest
from monitor.drift.result import DriftResult
from monitor.drift.stats import FloatArray, mean_difference


class AcceptanceDrift(WindowedTest):
    """Two-sided Mann–Whitney U on per-request acceptance; effect = mean difference with bootstrap CI."""

    test = "acceptance"
    metric = "acceptance_rate"
    default_floor = 0.05

    def compare(self, ref: FloatArray, cur: FloatArray) -> DriftResult:
        ref, cur = np.asarray(ref, dtype=float), np.asarray(cur, dtype=float)
        if (too_few := self.too_few(len(ref), len(cur))) is not None:
            return too_few
        if np.ptp(np.concatenate([ref, cur])) == 0:
            # All values equal (e.g. every request accepted everything): no evidence of a change.
            statistic, p = float(len(ref) * len(cur) / 2), 1.0
        else:
            u = st.mannwhitneyu(cur, ref, alternative="two-sided", method="asymptotic")
            statistic, p = float(u.statistic), float(u.pvalue)
        effect, ci = mean_difference(ref, cur, self.n_boot, self.ci_level)
        return DriftResult(
            test=self.test,
            metric=self.metric,
            n_ref=len(ref),
            n_cur=len(cur),
            statistic=statistic,
            p=p,
            effect=effect,
            ci=ci,
            decision="no_drift",
            passes_floor=abs(effect) >= self.floor,
            detail={"mean_ref": float(ref.mean()), "mean_cur": float(cur.mean())},
        )
