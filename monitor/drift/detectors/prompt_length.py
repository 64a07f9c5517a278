"""Prompt-length shift per workload: two-sample Kolmogorov–Smirnov test plus the PSI.

The KS test gives the p-value (its statistic D is the largest gap between the two empirical CDFs);
the population stability index over ten reference-decile bins is the effect, with a bootstrap
interval, and its floor is 0.25 (the usual "significant shift" threshold; 0.1-0.25 is "moderate").

Error rates: the asymptotic KS p-value is conservative for discrete data such as token counts
(ties), so the false-alarm rate is at most the nominal level. PSI has a positive bias under no
change of about (bins - 1)(1/n_ref + 1/n_cur), 0.09 at 200 requests per window: the reason the
floor is not lower.

>>> rng = np.random.default_rng(5)
>>> ref = rng.poisson(120, 400)
>>> r = PromptLengthShift().compare(ref, rng.poisson(240, 400))
>>> r.p < 1e-10, r.effect > 1, r.passes_floor
(True, True, True)
>>> PromptLengthShift().compare(ref, rng.poisson(120, 400)).passes_floor
False
"""

from __future__ import annotations

import numpy as np
from scipy import stats as st

from monitor.drift.detectors.windowed import WindowedTest
from monitor.drift.result import DriftResult
from monitor.drift.stats import (
    FloatArray,
    bin_index,
    binned_counts,
    bootstrap_bin_shares,
    distance_interval,
    psi,
    psi_bins,
)


class PromptLengthShift(WindowedTest):
    """KS two-sample test on prompt tokens; effect = PSI on reference deciles, bootstrap CI."""

    test = "prompt_length"
    metric = "prompt_tokens"
    default_floor = 0.25

    def compare(self, ref: FloatArray, cur: FloatArray) -> DriftResult:
        ref, cur = np.asarray(ref, dtype=float), np.asarray(cur, dtype=float)
        if (too_few := self.too_few(len(ref), len(cur))) is not None:
            return too_few
        ks = st.ks_2samp(ref, cur, method="asymp")
        edges = psi_bins(ref)
        effect = float(psi(binned_counts(ref, edges), binned_counts(cur, edges)))
        n_bins = len(edges) + 1
        ref_boot = bootstrap_bin_shares(bin_index(ref, edges), n_bins, self.n_boot, "ref")
        cur_boot = bootstrap_bin_shares(bin_index(cur, edges), n_bins, self.n_boot, "cur")
        draws = np.asarray(psi(ref_boot, cur_boot), dtype=float)
        return DriftResult(
            test=self.test,
            metric=self.metric,
            n_ref=len(ref),
            n_cur=len(cur),
            statistic=float(ks.statistic),
            p=float(ks.pvalue),
            effect=effect,
            ci=distance_interval(effect, draws, self.ci_level),
            decision="no_drift",
            passes_floor=effect >= self.floor,
            detail={"median_ref": float(np.median(ref)), "median_cur": float(np.median(cur))},
        )
