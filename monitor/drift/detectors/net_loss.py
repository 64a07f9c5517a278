"""Net loss: is speculation slower than plain decoding for this workload?

Both forms compare decode-phase speed (:func:`decoder.record.decode_ms_per_token`, ms per token
after the first) of the workload's speculative requests with that of requests decoded without
speculation, on the same target. Whatever the drafter costs (a model's passes and prompt reading,
an n-gram lookup's near-nothing, the longer verification pass every drafter makes the target run)
is inside the speculative requests' time: a cheap drafter with poor acceptance shows as the loss
it is, which no cost model of α, c and γ alone can promise.

Like for like. A token late in a long context costs more than an early one, so both populations
are split into strata by context length (prompt + output tokens; quartiles of the speculative
requests, fewer when the comparison population is small) and the speedup is

    Σ_s w_s · mean(plain ms/token in s)  /  Σ_s w_s · mean(speculative ms/token in s)

with w_s the speculative requests' share of stratum s: what plain decoding would have cost for the
speculative traffic's own length mix, over what speculation cost. Strata without requests of both
kinds are left out, as are plain requests whose context is more than 1.25x longer or shorter than
every speculative one's (``n_ref`` and ``n_cur`` count the requests used, ``detail`` the strata). Stratifying, not
matching: with a small holdout, matching discards most speculative requests; strata keep them all.
The interval resamples within strata (both populations) and is a bootstrap-t interval of the log
speedup: the percentile interval of a ratio of means of skewed, bimodal speeds (an n-gram request
near 22 ms a token, a draft-model one near 56) at 30 a side was too narrow. Where what the strata
leave falls below the minimum a side (a workload with just enough holdout requests, a few of them
outside the speculative ones' lengths), the comparison coarsens rather than gives up: one stratum
per load level, then one per load level over every context length (``detail["stratified_by"]``
says which). Load levels are never pooled: speculative and plain requests at different loads are
not compared.

* **Measured** (``measured``): the comparison population is the workload's **holdout** requests
  of the current window, a random share of its own traffic. The p-value is the van Elteren
  stratified Wilcoxon test (one-sided: speculative requests take more ms per token). "Speculation
  is slower than plain" (decision ``drift``) needs q below the level **and** the interval's upper
  bound below 1.
* **Estimate** (``estimated``): when the workload has too few holdout requests in the window, the
  comparison population is every request of the same **target** decoded without speculation
  (holdout or plain, any workload) over the reference and current windows. Plain requests are the
  controller's choice, not a random draw, so the result is flagged ``estimate``, has no p-value and
  decides ``drift`` only when its interval's upper bound is below 1.

Error rates (``benchmarks/drift_quality.py``, simulated, see ``benchmarks/RESULTS.md``): at most
the BH level for the measured form under no change (the rank test), with the interval rule on
top; the estimate has no p-value, its false-alarm rate is what the interval rule gives.

>>> rng = np.random.default_rng(6)
>>> spec, hold = rng.lognormal(3.2, 0.2, 300), rng.lognormal(3.0, 0.2, 60)   # speculation ~20 % slower
>>> r = NetLoss().measured(Population(spec, np.full(300, 200.0)), Population(hold, np.full(60, 200.0)))
>>> round(r.effect, 2), r.ci[1] < 1, r.passes_floor
(0.8, True, True)
>>> est = NetLoss().estimated(Population(spec, np.full(300, 200.0)), Population(hold, np.full(60, 200.0)))
>>> round(est.effect, 2), est.p is None, est.decision
(0.8, True, 'drift')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from scipy import stats as st

from monitor.drift.result import Decision, DriftResult, insufficient
from monitor.drift.stats import (
    FloatArray,
    bootstrap_moments,
    percentile_interval,
    studentized_ratio_draws,
    weighted_mean_moments,
)

if TYPE_CHECKING:
    from monitor.drift.sampling import Sample

# At most this many context strata per load level, and at least this many comparison requests per stratum.
MAX_STRATA = 4
PER_STRATUM = 10
# Plain requests count only within this factor of the speculative requests' context lengths.
SUPPORT = 1.25
# Below this share of the speculative requests with plain requests at their load and context, no verdict.
MIN_COVERAGE = 0.5


class Grain(NamedTuple):
    """How finely a comparison is stratified: context strata per load level, and the context support's factor."""

    name: str
    max_strata: int
    support: float | None  # None: plain requests of every context length count


# Finest first: each used only when the one before leaves too few requests a side.
GRAINS: tuple[Grain, ...] = (
    Grain("context length and load", MAX_STRATA, SUPPORT),
    Grain("load", 1, SUPPORT),
    Grain("load, every context length", 1, None),
)


def load_level(inflight: FloatArray) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Load levels of ``upstream_inflight``: 1, 2-3, 4-7, 8-15, ... (levels 1, 2, 3, 4, ...); unknown (NaN) is 0.

    A replica's time per token grows with the requests it batches; doubling steps keep the levels
    few while keeping within a level requests whose batches are alike.

    >>> load_level(np.array([1.0, 2.0, 3.0, 4.0, 9.0, np.nan])).tolist()
    [1, 2, 2, 3, 4, 0]
    """
    known = np.isfinite(inflight)
    levels = np.zeros(len(inflight), dtype=np.int64)
    levels[known] = 1 + np.floor(np.log2(np.maximum(inflight[known], 1.0))).astype(np.int64)
    return levels


class Population(NamedTuple):
    """Requests of one kind (speculative, or the plain ones compared with them), one entry each.

    ``ms``: decode ms per token; ``ctx``: context length (prompt + output tokens); ``load``: requests in
    flight at the replica when it started (None where no request says).
    """

    ms: FloatArray
    ctx: FloatArray
    load: FloatArray | None = None

    @property
    def levels(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Each request's load level (:func:`load_level`), all one unknown level without loads."""
        return load_level(np.full(len(self.ms), np.nan) if self.load is None else np.asarray(self.load, float))

    def as_floats(self) -> Population:
        """The same requests as float arrays."""
        return Population(np.asarray(self.ms, float), np.asarray(self.ctx, float), self.load)

    @classmethod
    def timed(cls, sample: Sample) -> Population:
        """The sample's requests that have a decode speed: ms per token, context length, load."""
        speed = sample.decode_ms_per_token
        known = np.isfinite(speed)
        return cls(speed[known], sample.context_tokens[known], sample.upstream_inflight[known])


@dataclass(frozen=True, slots=True)
class Strata:
    """Speculative and plain ms-per-token values grouped by load level and context-length stratum."""

    spec: list[FloatArray]
    plain: list[FloatArray]
    edges: list[float]
    levels: list[int]
    n_spec: int  # speculative requests offered, kept in a stratum or not

    grain: Grain = GRAINS[0]

    @classmethod
    def split(cls, speculative: Population, compared: Population, grain: Grain = GRAINS[0]) -> Strata:
        spec, spec_ctx, spec_level = speculative.ms, speculative.ctx, speculative.levels
        # Common support: a plain request far longer or shorter than any speculative one says
        # nothing about what the speculative traffic would have cost without speculation.
        inside = np.ones(len(compared.ctx), dtype=bool)
        if grain.support is not None:
            low, high = spec_ctx.min() / grain.support, spec_ctx.max() * grain.support
            inside = (compared.ctx >= low) & (compared.ctx <= high)
        plain, plain_ctx, plain_level = compared.ms[inside], compared.ctx[inside], compared.levels[inside]
        kept: list[tuple[FloatArray, FloatArray, int]] = []
        all_edges: list[float] = []
        for level in np.unique(spec_level):
            s, p = spec_level == level, plain_level == level
            k = max(1, min(grain.max_strata, int(p.sum()) // PER_STRATUM))
            edges = list(np.unique(np.quantile(spec_ctx[s], np.linspace(0, 1, k + 1)[1:-1]))) if k > 1 else []
            all_edges += [float(e) for e in edges]
            spec_bin = np.searchsorted(edges, spec_ctx[s], "right")
            plain_bin = np.searchsorted(edges, plain_ctx[p], "right")
            for b in range(len(edges) + 1):
                a, c = spec[s][spec_bin == b], plain[p][plain_bin == b]
                if len(a) and len(c):
                    kept.append((a, c, int(level)))
        spec_kept, plain_kept, levels = [a for a, _, _ in kept], [c for _, c, _ in kept], [lv for _, _, lv in kept]
        return cls(spec_kept, plain_kept, all_edges, levels, len(spec), grain)

    @property
    def coverage(self) -> float:
        """Share of the speculative requests that found plain requests at their load and context."""
        return self.used()[0] / self.n_spec if self.n_spec else 0.0

    @property
    def weights(self) -> FloatArray:
        sizes = np.array([len(a) for a in self.spec], dtype=float)
        result: FloatArray = sizes / sizes.sum()
        return result

    def means(self) -> tuple[float, float]:
        """Stratum-weighted mean ms per token: plain, speculative."""
        w = self.weights
        return float(w @ [b.mean() for b in self.plain]), float(w @ [a.mean() for a in self.spec])

    def speedup_draws(self, n_boot: int, tag: str = "") -> FloatArray:
        """Bootstrap-t draws of the speedup (:func:`~monitor.drift.stats.studentized_ratio_draws`), resampled within
        strata; ``tag`` gives a comparison resampling patterns of its own (independent load levels)."""
        w = self.weights
        plain = [bootstrap_moments(b, n_boot, f"{tag}plain{i}") for i, b in enumerate(self.plain)]
        spec = [bootstrap_moments(a, n_boot, f"{tag}spec{i}") for i, a in enumerate(self.spec)]

        def weighted(moments: list[tuple[FloatArray, FloatArray]]) -> tuple[FloatArray, FloatArray]:
            means, variances = (np.stack(column, axis=1) for column in zip(*moments, strict=True))
            return means @ w, variances @ (w * w)

        point = (*weighted_mean_moments(self.plain, w), *weighted_mean_moments(self.spec, w))
        draws: FloatArray = studentized_ratio_draws(weighted(plain), weighted(spec), point)
        return draws

    def van_elteren(self) -> tuple[float, float]:
        """Stratified Wilcoxon (van Elteren 1960): z and the one-sided p that speculation is slower.

        Each stratum's U statistic is weighted by 1 / (n_s + 1), which is locally most powerful when
        the shift is the same in every stratum; ties are corrected per stratum.
        """
        num, var = 0.0, 0.0
        for a, b in zip(self.spec, self.plain, strict=True):
            n1, n2 = len(a), len(b)
            n = n1 + n2
            ranks = st.rankdata(np.concatenate([a, b]))
            u = ranks[:n1].sum() - n1 * (n1 + 1) / 2
            _, ties = np.unique(ranks, return_counts=True)
            tie = (ties**3 - ties).sum() / (n * (n - 1)) if n > 1 else 0.0
            w = 1.0 / (n + 1)
            num += w * (u - n1 * n2 / 2)
            var += w * w * n1 * n2 / 12 * (n + 1 - tie)
        z = num / np.sqrt(var) if var > 0 else 0.0
        return float(z), float(st.norm.sf(z))

    def used(self) -> tuple[int, int]:
        return sum(len(a) for a in self.spec), sum(len(b) for b in self.plain)


class NetLoss:
    """Decode-phase speedup of speculation over plain decoding, stratified by context length."""

    test = "net_loss"
    metric = "speedup"

    def __init__(
        self, *, min_requests: int = 30, min_holdout: int = 30, n_boot: int = 500, ci_level: float = 0.95
    ) -> None:
        if min_requests < 2 or min_holdout < 2:
            raise ValueError(f"min_requests and min_holdout must be at least 2, got {min_requests}, {min_holdout}")
        self.min_requests = min_requests
        self.min_holdout = min_holdout
        self.n_boot = n_boot
        self.ci_level = ci_level

    def measured(self, spec: Population, holdout: Population) -> DriftResult:
        """Speculative against holdout requests of the same workload and window; n_ref is the holdout."""
        strata = self._strata(spec, holdout)
        if isinstance(strata, DriftResult):
            return strata
        z, p = strata.van_elteren()
        return self._result(strata, z, p, "no_drift", "measured: holdout vs speculative decode ms per token")

    def estimated(self, spec: Population, plain: Population) -> DriftResult:
        """Speculative requests against the target's plain and holdout requests; flagged, no p-value."""
        strata = self._strata(spec, plain)
        if isinstance(strata, DriftResult):
            return strata
        result = self._result(strata, None, None, "no_drift", "estimate: the target's plain decoding vs speculative")
        decision: Decision = "drift" if result.passes_floor else "no_drift"
        return result.replace(decision=decision, detail={**result.detail, "estimate": True})

    def _strata(self, speculative: Population, compared: Population) -> Strata | DriftResult:
        """The strata, or an ``insufficient_data`` result that says why there is no like-for-like comparison."""
        spec, plain = speculative.ms, compared.ms
        if len(spec) < self.min_requests or len(plain) < self.min_holdout:
            return insufficient(self.test, self.metric, len(plain), len(spec), self.min_holdout)
        spec_floats, compared_floats = speculative.as_floats(), compared.as_floats()
        for grain in GRAINS:
            strata = Strata.split(spec_floats, compared_floats, grain)
            used_spec, used_plain = strata.used()
            if used_spec >= self.min_requests and used_plain >= self.min_holdout and strata.coverage >= MIN_COVERAGE:
                return strata
        why = (
            f"strata do not overlap: {used_spec} of {len(spec)} speculative and {used_plain} of {len(plain)} plain "
            "requests share a load level"
        )
        result = insufficient(self.test, self.metric, len(plain), len(spec), self.min_holdout)
        return result.replace(note=why, detail={"inconclusive": why, "coverage": strata.coverage})

    def _result(self, strata: Strata, z: float | None, p: float | None, decision: Decision, note: str) -> DriftResult:
        ci = percentile_interval(strata.speedup_draws(self.n_boot), self.ci_level)
        used_spec, used_plain = strata.used()
        plain_mean, spec_mean = strata.means()
        return DriftResult(
            test=self.test,
            metric=self.metric,
            n_ref=used_plain,
            n_cur=used_spec,
            statistic=z,
            p=p,
            effect=plain_mean / spec_mean,
            ci=ci,
            decision=decision,
            passes_floor=ci[1] < 1.0,
            note=note,
            detail={
                "plain_ms_per_token": plain_mean,
                "speculative_ms_per_token": spec_mean,
                "strata": len(strata.spec),
                "stratified_by": strata.grain.name,
                "context_edges": strata.edges,
                "load_levels": sorted(set(strata.levels)),
                "coverage": strata.coverage,
            },
        )
