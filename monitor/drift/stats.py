"""Resampling helpers shared by the drift tests: bootstrap intervals, quantile draws, PSI.

All randomness comes from a ``numpy.random.Generator`` the caller seeds, so a run is reproducible.
Quantile intervals use the exact bootstrap distribution of an order statistic (a binomial sum over
the sorted sample) instead of resampling: the same answer as an infinite bootstrap, at O(n) cost.

>>> rng = np.random.default_rng(0)
>>> x = np.sort(rng.lognormal(0.0, 0.5, 500))
>>> point, draws = quantile_draws(x, 0.5, 2000, rng)
>>> round(point, 2), bool(np.quantile(draws, 0.025) < point < np.quantile(draws, 0.975))
(0.98, True)
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats

FloatArray = NDArray[np.float64]


def percentile_interval(draws: FloatArray, ci_level: float) -> tuple[float, float]:
    """The central ``ci_level`` interval of bootstrap draws."""
    tail = (1.0 - ci_level) / 2.0
    low, high = np.quantile(draws, [tail, 1.0 - tail])
    return float(low), float(high)


def distance_interval(point: float, draws: FloatArray, ci_level: float) -> tuple[float, float]:
    """Percentile interval of a distance (TVD, PSI), widened to contain the estimate.

    A resampled distance is biased upwards (resampling noise adds distance), so near zero the plain
    percentile interval can sit wholly above the estimate; widening keeps the report readable.
    """
    low, high = percentile_interval(draws, ci_level)
    return min(low, point), max(high, point)


@functools.lru_cache(maxsize=16)
def bootstrap_weights(n: int, n_boot: int, stream: str) -> FloatArray:
    """``n_boot`` rows of resampling counts (how often each of n items was drawn; rows sum to n).

    Any mean of a resample is then a matrix-vector product, ``weights @ x / n``. The pattern is
    fixed per (n, n_boot, stream) and cached: intervals are reproducible, a run generates each
    pattern once, and the two samples a test compares use different streams ("ref", "cur"), so
    their resamples are independent.
    """
    rng = np.random.default_rng(zlib.crc32(f"{n}|{n_boot}|{stream}".encode()))
    idx = rng.integers(0, n, size=(n_boot, n), dtype=np.int64) + (n * np.arange(n_boot))[:, None]
    weights: FloatArray = np.bincount(idx.ravel(), minlength=n * n_boot).reshape(n_boot, n).astype(np.float32)
    weights.setflags(write=False)
    return weights


def bootstrap_means(x: FloatArray, n_boot: int, stream: str) -> FloatArray:
    """Means of ``n_boot`` resamples of ``x`` (1-D)."""
    weights = bootstrap_weights(len(x), n_boot, stream)
    # einsum, not BLAS: OpenBLAS's threaded sgemv took 100x longer on a busy 2-core machine.
    means: FloatArray = np.einsum("bn,n->b", weights, np.asarray(x, dtype=np.float32)).astype(float) / len(x)
    return means


def bootstrap_moments(x: FloatArray, n_boot: int, stream: str) -> tuple[FloatArray, FloatArray]:
    """Means of ``n_boot`` resamples of ``x`` (1-D) and each mean's squared standard error (plug-in variance / n)."""
    weights = bootstrap_weights(len(x), n_boot, stream)
    values = np.asarray(x, dtype=np.float64)
    centred = (values - values.mean()).astype(np.float32)  # centred first: float32 keeps the spread, not the level
    shift = np.einsum("bn,n->b", weights, centred).astype(float) / len(x)
    square = np.einsum("bn,n->b", weights, centred * centred).astype(float) / len(x)
    variance: FloatArray = np.maximum(square - shift * shift, 0.0) / len(x)
    means: FloatArray = values.mean() + shift
    return means, variance


def weighted_mean_moments(groups: Sequence[FloatArray], weights: FloatArray) -> tuple[float, float]:
    """Σ w·mean of the groups and its squared standard error Σ w²·var/n (plug-in variance, as
    :func:`bootstrap_moments` takes it of each resample, so that a pivot compares like with like)."""
    mean = float(weights @ [g.mean() for g in groups])
    return mean, float((weights * weights) @ [g.var() / len(g) for g in groups])


def studentized_ratio_draws(
    num: tuple[FloatArray, FloatArray], den: tuple[FloatArray, FloatArray], point: tuple[float, float, float, float]
) -> FloatArray:
    """Bootstrap-t draws of a ratio of two independent means, ``num / den``, on the log scale.

    ``num`` and ``den``: each side's resampled means and their squared standard errors
    (:func:`bootstrap_moments`, weighted sums of them for stratified means); ``point``: the sample's
    numerator, its squared SE, the denominator, its squared SE. Each replicate's pivot
    t* = (log r* - log r) / se* (delta method: se² = var(num)/num² + var(den)/den²) is turned back
    into r · exp(-t* · se), so that :func:`percentile_interval` of the draws is the bootstrap-t
    interval. A percentile interval of a ratio of skewed means at 30 a side is too narrow on the
    side the skew points to; studentizing corrects that to second order (Hall 1988). A
    replicate's se* is floored at a tenth of the sample's: a resample that repeats a few values has
    little spread by construction, not by precision, and must not make its pivot explode.

    >>> rng = np.random.default_rng(1)
    >>> a, b = rng.lognormal(0, 0.5, 40), rng.lognormal(0, 0.5, 40)
    >>> ma, mb = bootstrap_moments(a, 2000, "a"), bootstrap_moments(b, 2000, "b")
    >>> one = np.ones(1)
    >>> point = (*weighted_mean_moments([a], one), *weighted_mean_moments([b], one))
    >>> low, high = percentile_interval(studentized_ratio_draws(ma, mb, point), 0.95)
    >>> bool(low < a.mean() / b.mean() < high)
    True
    """
    num_mean, num_var, den_mean, den_var = point
    se = math.sqrt(num_var / num_mean**2 + den_var / den_mean**2)
    (n_means, n_vars), (d_means, d_vars) = num, den
    if se == 0.0:  # every value alike on both sides: nothing varies, the ratio is what it is
        return np.full(len(n_means), num_mean / den_mean)
    se_star = np.sqrt(n_vars / n_means**2 + d_vars / d_means**2)
    t = (np.log(n_means / d_means) - math.log(num_mean / den_mean)) / np.maximum(se_star, se / 10.0)
    draws: FloatArray = (num_mean / den_mean) * np.exp(-t * se)
    return draws


def bootstrap_bin_shares(bins: np.ndarray[Any, np.dtype[np.intp]], n_bins: int, n_boot: int, stream: str) -> FloatArray:
    """Shares of each bin in ``n_boot`` resamples of items whose bin indices are ``bins``."""
    weights = bootstrap_weights(len(bins), n_boot, stream)
    order = np.argsort(bins, kind="stable")
    starts = np.searchsorted(bins[order], np.arange(n_bins))
    out = np.zeros((n_boot, n_bins))
    present = np.unique(bins)
    sums = np.add.reduceat(weights[:, order], starts[present], axis=1)
    out[:, present] = sums
    return out / len(bins)


def mean_difference(
    ref: FloatArray, cur: FloatArray, n_boot: int, ci_level: float
) -> tuple[float, tuple[float, float]]:
    """``mean(cur) - mean(ref)`` with a percentile bootstrap interval (both samples resampled)."""
    draws = bootstrap_means(cur, n_boot, "cur") - bootstrap_means(ref, n_boot, "ref")
    return float(cur.mean() - ref.mean()), percentile_interval(draws, ci_level)


def quantile_draws(sorted_x: FloatArray, q: float, n_boot: int, rng: np.random.Generator) -> tuple[float, FloatArray]:
    """The sample ``q``-quantile (order statistic k = ceil(q n)) and ``n_boot`` draws of its bootstrap distribution.

    A resample's k-th order statistic is at most x_(j) exactly when at least k of the n resampled
    values are at most x_(j), a Binomial(n, j/n) event; inverting that CDF samples it directly.
    """
    n = len(sorted_x)
    k = min(n, max(1, math.ceil(q * n)))
    cdf = stats.binom.sf(k - 1, n, np.arange(1, n + 1) / n)
    index = np.minimum(np.searchsorted(cdf, rng.random(n_boot)), n - 1)
    return float(sorted_x[k - 1]), sorted_x[index]


def quantile_ratio(
    ref: FloatArray, cur: FloatArray, q: float, n_boot: int, ci_level: float, rng: np.random.Generator
) -> tuple[float, tuple[float, float]]:
    """``quantile(cur) / quantile(ref)`` with a bootstrap interval; the windows are independent."""
    ref_point, ref_draws = quantile_draws(np.sort(ref), q, n_boot, rng)
    cur_point, cur_draws = quantile_draws(np.sort(cur), q, n_boot, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = cur_point / ref_point if ref_point > 0 else math.inf
        draws = np.where(ref_draws > 0, cur_draws / np.where(ref_draws > 0, ref_draws, 1.0), np.inf)
    return float(ratio), percentile_interval(draws, ci_level)


def psi_bins(ref: FloatArray, n_bins: int = 10) -> FloatArray:
    """Inner bin edges at the reference's quantiles (duplicates dropped: discrete lengths tie)."""
    edges: FloatArray = np.unique(np.quantile(ref, np.linspace(0, 1, n_bins + 1)[1:-1]))
    return edges


def psi(ref_counts: FloatArray, cur_counts: FloatArray, eps: float = 1e-4) -> float | FloatArray:
    """Population stability index, sum (c - r) ln(c / r) over bins; counts may be rows of a matrix."""
    r = np.maximum(ref_counts / ref_counts.sum(axis=-1, keepdims=True), eps)
    c = np.maximum(cur_counts / cur_counts.sum(axis=-1, keepdims=True), eps)
    value = ((c - r) * np.log(c / r)).sum(axis=-1)
    return float(value) if np.ndim(value) == 0 else np.asarray(value, dtype=float)


def binned_counts(values: FloatArray, edges: FloatArray) -> FloatArray:
    """Counts of ``values`` per bin of ``edges`` (``len(edges) + 1`` bins)."""
    index = np.searchsorted(edges, values, side="right")
    return np.bincount(index, minlength=len(edges) + 1).astype(float)


def bin_index(values: FloatArray, edges: FloatArray) -> np.ndarray[Any, np.dtype[np.intp]]:
    """The bin of each value (``len(edges) + 1`` bins)."""
    return np.searchsorted(edges, values, side="right")
