"""Traffic-mix drift: have the shares of workload tags changed between the windows?

Input: requests per workload in each window (counted in SQL from the rollups; every request is
one count, so the request is the unit here too). Test: chi-square test of homogeneity on the
2 × workloads table; workloads too rare for the approximation (expected count below 5) are pooled
into one ``(other)`` column. Effect: total variation distance between the share vectors (half the
sum of absolute share differences: the fraction of traffic that "moved"), with a parametric
(multinomial) bootstrap interval. Floor: 0.10.

Error rates: the chi-square approximation holds its nominal level when every expected count is at
least 5, which the pooling guarantees. With very large windows any diurnal wobble is significant;
the floor is what keeps such results quiet.

>>> TrafficMixDrift(seed=4).compare({"code": 500, "chat": 500}, {"code": 800, "chat": 200}).effect
0.3
>>> TrafficMixDrift(seed=4).compare({"code": 500, "chat": 500}, {"code": 480, "chat": 520}).passes_floor
False
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from scipy import stats as st

from monitor.drift.detectors.windowed import WindowedTest
from monitor.drift.result import DriftResult
from monitor.drift.stats import distance_interval

MIN_EXPECTED = 5.0


class TrafficMixDrift(WindowedTest):
    """Chi-square on workload shares; effect = total variation distance with bootstrap CI."""

    test = "traffic_mix"
    metric = "workload_share"
    default_floor = 0.1

    def __init__(
        self,
        *,
        floor: float | None = None,
        min_requests: int = 30,
        n_boot: int = 500,
        ci_level: float = 0.95,
        seed: int = 0,
    ) -> None:
        super().__init__(floor=floor, min_requests=min_requests, n_boot=n_boot, ci_level=ci_level)
        self.seed = seed

    def compare(self, ref: Mapping[str, int], cur: Mapping[str, int]) -> DriftResult:
        names = sorted(set(ref) | set(cur))
        table = np.array([[ref.get(w, 0) for w in names], [cur.get(w, 0) for w in names]], dtype=float)
        n_ref, n_cur = int(table[0].sum()), int(table[1].sum())
        if (too_few := self.too_few(n_ref, n_cur)) is not None:
            return too_few
        expected = table.sum(axis=1)[:, None] * table.sum(axis=0)[None, :] / table.sum()
        rare = expected.min(axis=0) < MIN_EXPECTED
        if rare.any():
            table = np.column_stack([table[:, ~rare], table[:, rare].sum(axis=1)])
        table = table[:, table.sum(axis=0) > 0]
        if table.shape[1] < 2:
            statistic, p = 0.0, 1.0
        else:
            chi = st.chi2_contingency(table, correction=False)
            statistic, p = float(chi.statistic), float(chi.pvalue)
        share_ref, share_cur = table[0] / n_ref, table[1] / n_cur
        effect = round(0.5 * float(np.abs(share_ref - share_cur).sum()), 12)
        rng = np.random.default_rng(self.seed)
        ref_draws = rng.multinomial(n_ref, share_ref, self.n_boot) / n_ref
        cur_draws = rng.multinomial(n_cur, share_cur, self.n_boot) / n_cur
        draws = 0.5 * np.abs(ref_draws - cur_draws).sum(axis=1)
        return DriftResult(
            test=self.test,
            metric=self.metric,
            n_ref=n_ref,
            n_cur=n_cur,
            statistic=statistic,
            p=p,
            effect=effect,
            ci=distance_interval(effect, draws, self.ci_level),
            decision="no_drift",
            passes_floor=effect >= self.floor,
            detail={
                "share_ref": {w: round(ref.get(w, 0) / n_ref, 4) for w in names},
                "share_cur": {w: round(cur.get(w, 0) / n_cur, 4) for w in names},
            },
        )
