"""Acceptance-length drift: has the shape of "how many drafts does a step accept" changed?

Input per request: its acceptance histogram (steps that accepted exactly j drafts, j = 0..gamma).
Each request is turned into its *share* vector (histogram / steps) and the shares are summed, so
every request weighs one, however many steps it took: the request stays the unit of evidence. A
chi-square test of homogeneity compares the two request-weighted histograms (categories with an
expected count below 5 are merged into their lower neighbour).

Error rates: a request's share of category j lies in [0, 1] with mean p_j, so its variance is at
most p_j (1 - p_j), that of one categorical draw: the test is conservative (false-alarm rate at
most the nominal level), never anti-conservative as a step-level test would be. Effect: total
variation distance between the two distributions, bootstrap CI over requests; floor 0.05.

>>> rng = np.random.default_rng(2)
>>> def hists(alpha, n):   # 10 steps of gamma = 4 per request, geometric run lengths
...     runs = np.minimum(rng.geometric(1 - alpha, (n, 10)) - 1, 4)
...     return np.stack([np.bincount(r, minlength=5) for r in runs])
>>> r = AcceptanceLengthDrift().compare(hists(0.7, 300), hists(0.5, 300))
>>> r.p < 1e-6, round(r.effect, 2), r.passes_floor
(True, 0.23, True)
"""

from __future__ import annotations

import numpy as np
from scipy import stats as st

from monitor.drift.result import DriftResult
from monitor.drift.stats import FloatArray, bootstrap_means, distance_interval
from monitor.drift.windowed import WindowedTest

MIN_EXPECTED = 5.0


def request_shares(histograms: FloatArray) -> FloatArray:
    """Rows normalised to sum 1; requests without steps are dropped."""
    h = np.asarray(histograms, dtype=float)
    totals = h.sum(axis=1)
    keep = totals > 0
    shares: FloatArray = h[keep] / totals[keep, None]
    return shares


def _merge_sparse(table: FloatArray) -> FloatArray:
    """Fold columns whose expected count is below MIN_EXPECTED into a neighbour, right to left.

    Right to left, so a thin high-acceptance tail folds into the last well-populated length.
    """
    merged = [table[:, j] for j in range(table.shape[1])]
    while len(merged) > 1:
        current = np.stack(merged, axis=1)
        expected = current.sum(axis=1)[:, None] * current.sum(axis=0)[None, :] / current.sum()
        sparse = [j for j in range(len(merged)) if expected[:, j].min() < MIN_EXPECTED]
        if not sparse:
            break
        j = sparse[-1]
        into = j - 1 if j > 0 else 1
        merged[into] = merged[into] + merged[j]
        del merged[j]
    return np.stack(merged, axis=1)


class AcceptanceLengthDrift(WindowedTest):
    """Chi-square on request-weighted acceptance-length histograms; effect = TVD with bootstrap CI."""

    test = "acceptance_length"
    metric = "acceptance_length_histogram"
    default_floor = 0.05

    def compare(self, ref_histograms: FloatArray, cur_histograms: FloatArray) -> DriftResult:
        ref, cur = request_shares(ref_histograms), request_shares(cur_histograms)
        if (too_few := self.too_few(len(ref), len(cur))) is not None:
            return too_few
        width = max(ref.shape[1], cur.shape[1])
        ref = np.pad(ref, ((0, 0), (0, width - ref.shape[1])))
        cur = np.pad(cur, ((0, 0), (0, width - cur.shape[1])))
        ref_sum, cur_sum = ref.sum(axis=0), cur.sum(axis=0)
        table = np.stack([ref_sum, cur_sum])
        table = table[:, table.sum(axis=0) > 0]
        if table.shape[1] > 1:
            table = _merge_sparse(table)
        if table.shape[1] < 2:
            statistic, p = 0.0, 1.0
        else:
            chi = st.chi2_contingency(table, correction=False)
            statistic, p = float(chi.statistic), float(chi.pvalue)
        effect = 0.5 * float(np.abs(ref_sum / len(ref) - cur_sum / len(cur)).sum())
        ref_boot, cur_boot = bootstrap_means(ref, self.n_boot, "ref"), bootstrap_means(cur, self.n_boot, "cur")
        draws = 0.5 * np.abs(ref_boot - cur_boot).sum(axis=1)
        return DriftResult(
            self.test,
            self.metric,
            len(ref),
            len(cur),
            statistic,
            p,
            effect,
            distance_interval(effect, draws, self.ci_level),
            "no_drift",
            passes_floor=effect >= self.floor,
            detail={
                "share_ref": [round(float(v), 4) for v in ref_sum / len(ref)],
                "share_cur": [round(float(v), 4) for v in cur_sum / len(cur)],
            },
        )
