"""Net loss: is speculation slower than plain decoding for this workload?

Measured, when there is enough holdout traffic (requests the controller decoded without
speculation): speedup = mean ms per output token of holdout over that of speculative requests in
the same window, with a bootstrap interval (both populations resampled). The p-value is a
one-sided Mann–Whitney U test that speculative requests take more ms per token than holdout ones.
"Speculation is slower than plain" (decision ``drift``) needs q below the level **and** the
interval's upper bound below 1.

Estimated, when holdout is thin: Leviathan et al. (2023), speedup = (1 - α^(γ+1)) / ((1 - α)(γc + 1))
from the measured per-token acceptance α (maximum likelihood under their i.i.d. model: accepted
drafts over accepted drafts plus rejections), the draft-to-target cost ratio c (draft ms per drafted
token over verify ms per step) and γ. Its interval comes from resampling requests. The result is
flagged ``estimate`` and has no p-value; it decides ``drift`` when its upper bound is below 1.
The model ignores per-step overheads, so it errs towards optimism: an estimated loss is credible.

Error rates: with the measured form the false-alarm rate is at most the BH level (the MWU test)
and additionally needs a 95 % interval wholly below 1.

>>> rng = np.random.default_rng(6)
>>> spec, hold = rng.lognormal(3.2, 0.2, 300), rng.lognormal(3.0, 0.2, 60)   # speculation ~20 % slower
>>> r = NetLoss().measured(spec, hold)
>>> round(r.effect, 2), r.ci[1] < 1, r.passes_floor
(0.8, True, True)
>>> est = NetLoss().estimated(accepted=np.full(100, 30.0), rejections=np.full(100, 10.0),
...     draft_ms=np.full(100, 8.0), drafted=np.full(100, 40.0), verify_ms=np.full(100, 400.0),
...     steps=np.full(100, 10.0), gamma=4)
>>> round(est.effect, 3), est.note
(2.991, 'estimate (Leviathan et al.): α=0.750, c=0.005, γ=4')
"""

from __future__ import annotations

import numpy as np
from scipy import stats as st

from monitor.drift.result import Decision, DriftResult, insufficient
from monitor.drift.stats import FloatArray, bootstrap_means, percentile_interval


def leviathan_speedup(alpha: FloatArray | float, gamma: int, c: FloatArray | float) -> FloatArray:
    """Expected walltime improvement: tokens per step over the cost of a step in target passes."""
    a = np.clip(np.asarray(alpha, dtype=float), 0.0, 1.0 - 1e-9)
    tokens_per_step = (1.0 - a ** (gamma + 1)) / (1.0 - a)
    return np.asarray(tokens_per_step / (gamma * np.asarray(c, dtype=float) + 1.0), dtype=float)


class NetLoss:
    """Speedup of speculation over holdout (measured) or Leviathan's formula (estimate)."""

    test = "net_loss"
    metric = "speedup"

    def __init__(
        self, *, min_requests: int = 30, min_holdout: int = 30, n_boot: int = 500, ci_level: float = 0.95
    ) -> None:
        self.min_requests = min_requests
        self.min_holdout = min_holdout
        self.n_boot = n_boot
        self.ci_level = ci_level

    def measured(self, speculative_ms_per_token: FloatArray, holdout_ms_per_token: FloatArray) -> DriftResult:
        spec = np.asarray(speculative_ms_per_token, dtype=float)
        hold = np.asarray(holdout_ms_per_token, dtype=float)
        if len(spec) < self.min_requests or len(hold) < self.min_holdout:
            return insufficient(self.test, self.metric, len(hold), len(spec), self.min_holdout)
        draws = bootstrap_means(hold, self.n_boot, "ref") / bootstrap_means(spec, self.n_boot, "cur")
        speedup = float(hold.mean() / spec.mean())
        ci = percentile_interval(draws, self.ci_level)
        u = st.mannwhitneyu(spec, hold, alternative="greater", method="asymptotic")
        # n_ref is the holdout (plain) population, n_cur the speculative one.
        return DriftResult(
            self.test,
            self.metric,
            len(hold),
            len(spec),
            float(u.statistic),
            float(u.pvalue),
            speedup,
            ci,
            "no_drift",
            passes_floor=ci[1] < 1.0,
            note="measured: holdout vs speculative ms per output token",
            detail={"holdout_ms_per_token": float(hold.mean()), "speculative_ms_per_token": float(spec.mean())},
        )

    def estimated(
        self,
        *,
        accepted: FloatArray,
        rejections: FloatArray,
        draft_ms: FloatArray,
        drafted: FloatArray,
        verify_ms: FloatArray,
        steps: FloatArray,
        gamma: int,
        n_holdout: int = 0,
    ) -> DriftResult:
        """Per-request sums in, one flagged estimate out; ``n_holdout`` is reported as n_ref."""
        sums = (accepted, rejections, draft_ms, drafted, verify_ms, steps)
        cols = np.stack([np.asarray(v, dtype=float) for v in sums])
        n = cols.shape[1]
        if n < self.min_requests or gamma < 1:
            return insufficient(self.test, self.metric, n_holdout, n, self.min_requests)

        def speedup(sums: FloatArray) -> FloatArray:
            acc, rej, dms, dtok, vms, stp = sums
            alpha = acc / np.maximum(acc + rej, 1e-12)
            c = np.where((dtok > 0) & (vms > 0), (dms / np.maximum(dtok, 1e-12)) / (vms / np.maximum(stp, 1e-12)), 0.0)
            return leviathan_speedup(alpha, gamma, c)

        totals = cols.sum(axis=1)
        point = float(speedup(totals))
        draws = speedup(bootstrap_means(cols.T, self.n_boot, "cur").T * n)
        ci = percentile_interval(draws, self.ci_level)
        acc, rej, dms, dtok, vms, stp = totals
        alpha = acc / max(acc + rej, 1e-12)
        c = (dms / dtok) / (vms / stp) if dtok > 0 and vms > 0 and stp > 0 else 0.0
        decision: Decision = "drift" if ci[1] < 1.0 else "no_drift"
        return DriftResult(
            self.test,
            self.metric,
            n_holdout,
            n,
            None,
            None,
            point,
            ci,
            decision,
            passes_floor=ci[1] < 1.0,
            note=f"estimate (Leviathan et al.): α={alpha:.3f}, c={c:.3f}, γ={gamma}",
            detail={"estimate": True, "alpha": float(alpha), "c": float(c), "gamma": gamma},
        )
