"""Why acceptance changed: the symmetric Kitagawa split of R = Σ accepted / Σ drafted into mix and within parts.

Cells are workloads, weights w_c their share of drafted tokens, rates r_c = accepted / drafted in the
cell; bars are the mean of the reference (0) and current (1) window. Then, exactly,

    R1 − R0 = Σ_c (r̄_c − R̄)(w1_c − w0_c)   [mix: centred, so a shift towards a below-average cell reads negative]
            + Σ_c w̄_c (r1_c − r0_c)          [within c]
            + the rest                        [unexplained: cells too thin to split, see below]

A cell with fewer than ``min_requests`` requests in either window is merged into one ``other`` cell;
if that is still thin, its whole contribution is the ``unexplained`` part ("not enough data to
split"). A window without drafts gives a single ``unexplained`` part and no split; one cell only, its
within part alone (the whole change).

Intervals: Poisson bootstrap over whole requests (each request of a window weighted Poisson(1), so
the per-workload counts vary as they do between real windows), never over tokens. A stratum (one
window, workload and pair) read as a sample of n of its N requests is resampled on the sample and
its replicate deviation scaled by √(N/n): exact (the plain Poisson bootstrap) where the sample is
the whole stratum, its normal limit otherwise (docs/statistics.md, "Why acceptance changed").
Benjamini–Hochberg across the parts (normal p-values from the bootstrap standard error) decides,
with the interval excluding zero and the size floor, which parts are named.

>>> rng = np.random.default_rng(3)
>>> def stratum(window, cell, rate, n):
...     d = rng.integers(8, 40, n).astype(float)
...     return Stratum(window, cell, d, rng.binomial(d.astype(int), rate).astype(float))
>>> strata = [stratum(0, "chat", 0.4, 600), stratum(0, "code", 0.7, 600),
...           stratum(1, "chat", 0.4, 1400), stratum(1, "code", 0.7, 600)]
>>> e = explain(strata, min_requests=30, n_boot=400, seed=1, fdr_level=0.01)
>>> [(p.cause, p.workload, p.named) for p in e.parts]
[('mix', None, True), ('within', 'chat', False), ('within', 'code', False)]
>>> abs(sum(p.value for p in e.parts) - e.change) < 1e-12
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

import numpy as np
from scipy import stats as st

from monitor.drift.result import benjamini_hochberg
from monitor.drift.stats import FloatArray, percentile_interval

# Level 1 gives mix, within and unexplained; the factor groups of a within part come as their own causes
# (``load`` and ``acceptance`` in a split of decode speed only).
Cause = Literal[
    "mix", "within", "length", "sampling", "style", "content", "version", "health", "load", "acceptance", "unexplained"
]
OTHER: Final = "other"
# Parts smaller than this are never named: a true 0.004 is not what a person paged at night needs.
NAMED_FLOOR: Final = 0.01
NOT_SPLIT: Final = "not enough data to split"


@dataclass(frozen=True, slots=True)
class Metric:
    """What a split divides: a ratio of per-request sums (numerator / tokens), and how it is said.

    The same exact split holds for any such ratio: acceptance is accepted / drafted tokens, its
    shares are of drafts; decode time per token is decode ms / (output tokens − 1), its shares are
    of decode tokens, and a rise is the bad direction.
    """

    key: str
    title: str  # the sentence's subject
    tokens: str  # what a cell's share is a share of
    bounded: bool  # the numerator never exceeds the tokens (acceptance)
    places: int
    unit: str
    floor: float  # a smaller part is never named; relative: times the reference window's rate
    relative_floor: bool

    def floor_at(self, rate_ref: float | None) -> float:
        """The smallest part named, in the metric's units, for a reference window at ``rate_ref``."""
        return self.floor * (rate_ref if self.relative_floor and rate_ref is not None else 1.0)


ACCEPTANCE: Final = Metric("acceptance", "Acceptance", "drafts", True, 2, "", NAMED_FLOOR, False)
# 1 % of the reference's ms per token: a 0.2 ms move of a 20 ms token is not what anyone needs paged about.
DECODE_SPEED: Final = Metric("ms_per_token", "Decode time per token", "decode tokens", False, 1, " ms", 0.01, True)
# Strata up to this many requests are resampled request by request; larger ones from the normal limit.
EXACT_UP_TO: Final = 256


@dataclass(frozen=True, slots=True)
class Stratum:
    """Per-request drafted and accepted tokens of one window (0 reference, 1 current) and cell.

    ``population`` is how many requests the stratum holds when the arrays are a uniform sample of it,
    and ``totals`` its exact (accepted, drafted) sums; None: the arrays are the whole stratum.
    """

    window: int
    cell: str
    drafted: FloatArray
    accepted: FloatArray
    population: int | None = None
    totals: tuple[float, float] | None = None


@dataclass(frozen=True, slots=True)
class Part:
    """One part of the change: its cause, the workload it sits in (None: all), value and interval."""

    cause: Cause
    workload: str | None
    value: float
    low: float | None
    high: float | None
    named: bool = False
    q: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "workload": self.workload,
            "value": _finite(self.value),
            "low": _finite(self.low),
            "high": _finite(self.high),
            "detail": {**self.detail, "named": self.named, "q": _finite(self.q)},
        }


@dataclass(frozen=True, slots=True)
class Explanation:
    """The change of acceptance between two windows and its parts (they add up to ``change``)."""

    change: float | None
    low: float | None
    high: float | None
    rate_ref: float | None
    rate_cur: float | None
    parts: tuple[Part, ...]
    requests: tuple[int, int] = (0, 0)
    metric: Metric = ACCEPTANCE

    @property
    def floor(self) -> float:
        """The smallest part named, in the metric's units."""
        return self.metric.floor_at(self.rate_ref)

    @property
    def named(self) -> list[Part]:
        return [p for p in self.parts if p.named]

    def for_workload(self, workload: str) -> Explanation:
        """The parts about ``workload``: its within part and the run-wide ones (mix, unexplained)."""
        return replace(self, parts=tuple(p for p in self.parts if p.workload in (None, workload)))

    def with_split(self, within: Part, parts: Sequence[Part]) -> Explanation:
        """``within`` replaced by its Level 2 parts (they add up to it), each holding it in ``detail["within"]``."""
        said = {"value": within.value, "low": within.low, "high": within.high, "named": within.named}
        split = tuple(replace(p, detail={**p.detail, "within": {**said, **within.detail}}) for p in parts)
        i = self.parts.index(within)
        return replace(self, parts=self.parts[:i] + split + self.parts[i + 1 :])

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric.key,
            "change": _finite(self.change),
            "low": _finite(self.low),
            "high": _finite(self.high),
            "parts": [p.to_json() for p in self.parts],
            "detail": {
                "rate_ref": _finite(self.rate_ref),
                "rate_cur": _finite(self.rate_cur),
                "requests_ref": self.requests[0],
                "requests_cur": self.requests[1],
                "summary": sentence(self),
            },
        }


def not_split(
    reason: str,
    change: float | None = None,
    rates: tuple[float | None, float | None] = (None, None),
    requests: tuple[int, int] = (0, 0),
    metric: Metric = ACCEPTANCE,
) -> Explanation:
    """No split: the whole change (if known) is one ``unexplained`` part that says why."""
    value = change if change is not None else math.nan
    part = Part("unexplained", None, value, None, None, detail={"reason": f"{NOT_SPLIT}: {reason}"})
    return Explanation(change, None, None, rates[0], rates[1], (part,), requests, metric)


@dataclass(frozen=True, slots=True)
class _Cells:
    """Accepted and drafted totals per window, cell and replicate (column 0: the estimate)."""

    names: list[str]
    accepted: FloatArray  # shape (2, cells, 1 + n_boot)
    drafted: FloatArray
    requests: np.ndarray[Any, np.dtype[np.int64]]  # shape (2, cells): requests measured (sampled)
    population: np.ndarray[Any, np.dtype[np.int64]]  # shape (2, cells): requests the windows hold


def explain(
    strata: Sequence[Stratum],
    *,
    min_requests: int,
    n_boot: int,
    seed: int,
    fdr_level: float,
    ci_level: float = 0.95,
    metric: Metric = ACCEPTANCE,
) -> Explanation:
    """Split the change of the pooled ratio between window 0 and window 1 (see the module docstring).

    A stratum's ``drafted`` and ``accepted`` are the ratio's tokens and numerator: for ``DECODE_SPEED``,
    decode tokens and decode milliseconds.
    """
    clean = [_clean(s, metric.bounded) for s in strata]
    requests = tuple(sum(len(s.drafted) for s in clean if s.window == k) for k in (0, 1))
    totals = [sum(_totals(s)[1] for s in clean if s.window == k) for k in (0, 1)]
    for k, name in ((0, "reference"), (1, "current")):
        if totals[k] <= 0:
            reason = f"no {metric.tokens} in the {name} window"
            return not_split(reason, requests=(requests[0], requests[1]), metric=metric)
    cells = _resample(_merge_thin(clean, min_requests), n_boot, seed)
    good = [i for i, name in enumerate(cells.names) if cells.requests[:, i].min() >= min_requests]
    rate = cells.accepted.sum(axis=1) / cells.drafted.sum(axis=1)  # (2, replicates)
    change = rate[1] - rate[0]
    rates = (float(rate[0, 0]), float(rate[1, 0]))
    pair = (requests[0], requests[1])
    floor = metric.floor_at(rates[0])
    if not good:
        reason = f"every workload has fewer than {min_requests} requests in a window"
        return not_split(reason, change[0], rates, pair, metric)
    share = cells.drafted / cells.drafted.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        cell_rate = cells.accepted / cells.drafted
    w_bar, r_bar = share.mean(axis=0), cell_rate.mean(axis=0)  # (cells, replicates)
    g = np.array(good)
    mix_terms = (r_bar[g] - rate.mean(axis=0)) * (share[1, g] - share[0, g])
    within = w_bar[g] * (cell_rate[1, g] - cell_rate[0, g])
    draws = np.vstack([mix_terms.sum(axis=0, keepdims=True), within])
    rest = change - draws.sum(axis=0)
    mix: tuple[Cause, str | None] = ("mix", None)
    labels = [mix, *(("within", cells.names[i]) for i in good)]
    if len(cells.names) == 1:  # one workload: no mix to speak of, its within part is the whole change
        draws, labels = draws[1:], labels[1:]
    z = draws[:, 0] / np.maximum(draws[:, 1:].std(axis=1), 1e-300)
    qs = benjamini_hochberg(list(2 * st.norm.sf(np.abs(z))))
    parts = []
    for j, ((cause, workload), q) in enumerate(zip(labels, qs, strict=True)):
        value, (low, high) = float(draws[j, 0]), interval(draws[j, 1:], ci_level)
        named = q < fdr_level and (low > 0 or high < 0) and abs(value) >= floor
        if cause == "mix":
            detail = _mix_detail(cells.names, good, share[:, :, 0], mix_terms[:, 0])
        else:
            i = cells.names.index(str(workload))
            detail = _within_detail(cells, i, share[:, i, 0], cell_rate[:, i, 0])
            workload = None if workload == OTHER else workload
        parts.append(Part(cause, workload, value, low, high, bool(named), q, detail))
    thin = [cells.names[i] for i in range(len(cells.names)) if i not in good]
    if thin:
        reason = f"{NOT_SPLIT}: fewer than {min_requests} requests in a window ({', '.join(thin)})"
        low, high = interval(rest[1:], ci_level)
        parts.append(Part("unexplained", None, float(rest[0]), low, high, detail={"reason": reason}))
    low, high = interval(change[1:], ci_level)
    return Explanation(float(change[0]), low, high, rates[0], rates[1], tuple(parts), pair, metric)


def usable(d: FloatArray, a: FloatArray, bounded: bool) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Requests with a finite, positive token count ``d`` and a finite numerator ``a`` in [0, d] ([0, ∞) unbounded)."""
    return np.asarray(np.isfinite(d) & np.isfinite(a) & (d > 0) & (a >= 0) & ((a <= d) | (not bounded)))


def _clean(s: Stratum, bounded: bool = True) -> Stratum:
    """The stratum's :func:`usable` requests; its totals only where they can be its sums."""
    d, a = np.asarray(s.drafted, dtype=float), np.asarray(s.accepted, dtype=float)
    keep = usable(d, a, bounded)
    totals = s.totals
    fits = totals is not None and all(map(math.isfinite, totals)) and totals[1] > 0 and totals[0] >= 0
    if totals is not None and not (fits and (totals[0] <= totals[1] or not bounded)):
        totals = None  # figures that cannot be a stratum's sums: the sample stands for it
    population = s.population if totals is not None else None
    return Stratum(s.window, s.cell, d[keep], a[keep], population, totals)


def _totals(s: Stratum) -> tuple[float, float]:
    return s.totals if s.totals is not None else (float(s.accepted.sum()), float(s.drafted.sum()))


def _merge_thin(strata: Sequence[Stratum], min_requests: int) -> list[Stratum]:
    """Strata of cells with fewer than ``min_requests`` requests in either window, relabelled ``other``."""
    counts: dict[tuple[str, int], int] = {}
    for s in strata:
        counts[(s.cell, s.window)] = counts.get((s.cell, s.window), 0) + len(s.drafted)
    cells = {s.cell for s in strata}
    thin = {c for c in cells if min(counts.get((c, 0), 0), counts.get((c, 1), 0)) < min_requests}
    if len(thin) < 2:
        return list(strata)  # one thin cell merged with nothing is the same thin cell
    return [Stratum(s.window, OTHER, s.drafted, s.accepted, s.population, s.totals) if s.cell in thin else s
            for s in strata]  # fmt: skip


def _resample(strata: Sequence[Stratum], n_boot: int, seed: int) -> _Cells:
    names = sorted({s.cell for s in strata}, key=lambda c: (c == OTHER, c))
    accepted = np.zeros((2, len(names), 1 + n_boot))
    drafted = np.zeros_like(accepted)
    requests = np.zeros((2, len(names)), dtype=np.int64)
    population = np.zeros_like(requests)
    rng = np.random.default_rng(seed)
    # Strata in a fixed order, so that the same data gives the same draws whatever order it was read in.
    for s in sorted(strata, key=lambda s: (s.window, s.cell, len(s.drafted), float(s.drafted.sum()))):
        i = names.index(s.cell)
        a_tot, d_tot = _totals(s)
        n = len(s.drafted)
        requests[s.window, i] += n
        population[s.window, i] += max(n, s.population or 0)
        accepted[s.window, i, 0] += a_tot
        drafted[s.window, i, 0] += d_tot
        if n == 0:
            accepted[s.window, i, 1:] += a_tot
            drafted[s.window, i, 1:] += d_tot
            continue
        scale = math.sqrt(s.population / n) if s.population is not None and s.population > n else 1.0
        deviation = _deviations(s, n_boot, rng)
        accepted[s.window, i, 1:] += a_tot + scale * deviation[:, 0]
        drafted[s.window, i, 1:] += d_tot + scale * deviation[:, 1]
    # A replicate that drew no request of a cell has no rate there: a vanishing weight keeps it finite.
    drafted[:, :, 1:] = np.maximum(drafted[:, :, 1:], 1e-9)
    return _Cells(names, accepted, drafted, requests, population)


def _deviations(s: Stratum, n_boot: int, rng: np.random.Generator) -> FloatArray:
    """Poisson-bootstrap deviations of a stratum's (accepted, drafted) sums from its own, ``n_boot`` x 2.

    Up to ``EXACT_UP_TO`` requests the requests are weighted one by one. Above, the deviations are
    drawn from their normal limit: mean zero and the Poisson bootstrap's own covariance, Σ (a, d)ᵀ(a, d)
    over the requests. The sums of hundreds of independent requests are normal to well within what
    a 95 % interval resolves, and this costs O(n) instead of O(n · n_boot).
    """
    pairs = np.column_stack([s.accepted, s.drafted])
    if len(pairs) <= EXACT_UP_TO:
        weights = rng.poisson(1.0, (n_boot, len(pairs))).astype(float)
        return np.asarray(weights @ pairs - pairs.sum(axis=0), dtype=float)
    values, vectors = np.linalg.eigh(pairs.T @ pairs)
    root = vectors * np.sqrt(np.clip(values, 0.0, None))  # root @ root.T is the covariance, singular or not
    return np.asarray(rng.standard_normal((n_boot, 2)) @ root.T, dtype=float)


def interval(draws: FloatArray, ci_level: float) -> tuple[float, float]:
    """:func:`percentile_interval` of the finite draws (a replicate without drafts has no rate); NaN if none."""
    finite = draws[np.isfinite(draws)]
    return percentile_interval(finite, ci_level) if len(finite) else (math.nan, math.nan)


def _mix_detail(names: list[str], good: list[int], share: FloatArray, terms: FloatArray) -> dict[str, Any]:
    """Each cell's share of drafts in both windows, and the one the mix moved most towards or away from."""
    total = float(terms.sum())
    lead = max(range(len(good)), key=lambda j: terms[j] * math.copysign(1.0, total))
    i = good[lead]
    return {
        "shares": {names[k]: [float(share[0, k]), float(share[1, k])] for k in range(len(names))},
        "workload": names[i],
        "toward": bool(share[1, i] > share[0, i]),
    }


def _within_detail(cells: _Cells, i: int, share: FloatArray, rate: FloatArray) -> dict[str, Any]:
    return {
        "rate_ref": float(rate[0]),
        "rate_cur": float(rate[1]),
        "share_ref": float(share[0]),
        "share_cur": float(share[1]),
        "requests_ref": int(cells.population[0, i]),
        "requests_cur": int(cells.population[1, i]),
        "sampled_ref": int(cells.requests[0, i]),
        "sampled_cur": int(cells.requests[1, i]),
        **({"merged": True} if cells.names[i] == OTHER else {}),
    }


def sentence(e: Explanation) -> str:
    """One or two sentences naming the parts clear of noise, e.g. "Acceptance fell 0.12 (0.61 -> 0.49): ..."."""
    m = e.metric
    if e.change is None or not math.isfinite(e.change) or e.rate_ref is None or e.rate_cur is None:
        reasons = [str(p.detail.get("reason")) for p in e.parts if "reason" in p.detail]
        return f"{m.title} change: {reasons[0] if reasons else NOT_SPLIT}."
    verb = "fell" if e.change < 0 else "rose"
    head = f"{m.title} {verb} {_number_of(abs(e.change), m)} ({_rates(e.rate_ref, e.rate_cur, m)})"
    # (value, phrase) of each named Level 1 part; a split workload's within part says its named causes.
    said: list[tuple[float, str]] = []
    for p in e.parts:
        if p.cause in ("mix", "within") and p.named:
            said.append((p.value, _phrase(p, e.change, m)))
    for workload, parts in _split_workloads(e).items():
        within = parts[0].detail["within"]
        if not within["named"]:
            continue
        phrase = _within_phrase(within["value"], workload, within, e.change, m)
        named = [p for p in sorted(parts, key=lambda p: -abs(p.value)) if p.named and p.cause != "unexplained"]
        causes = [_cause_phrase(p, within["value"], m) for p in named]
        said.append((within["value"], phrase + (f", of which {', '.join(causes)}" if causes else "")))
    if not said:
        reasons = [str(p.detail["reason"]) for p in e.parts if "reason" in p.detail]
        tail = reasons[0] if reasons else "no part of it stands clear of noise"
        return f"{head}: {tail}."
    phrases = [phrase for _, phrase in sorted(said, key=lambda s: -abs(s[0]))]
    rest = e.change - sum(value for value, _ in said)
    if abs(rest) >= e.floor / 2:
        phrases.append(f"{_amount(rest, e.change, m)} unexplained")
    return f"{head}: {', '.join(phrases)}."


def _split_workloads(e: Explanation) -> dict[str, list[Part]]:
    split: dict[str, list[Part]] = {}
    for p in e.parts:
        if "within" in p.detail and p.workload is not None:
            split.setdefault(p.workload, []).append(p)
    return split


def _number_of(value: float, m: Metric) -> str:
    return f"{value:.{m.places}f}{m.unit}"


def _rates(ref: float, cur: float, m: Metric) -> str:
    return f"{ref:.{m.places}f} -> {cur:.{m.places}f}{m.unit}"


def _amount(value: float, change: float, m: Metric) -> str:
    # A part against the direction of the change is said as such, not as a bare negative number.
    if (value < 0) == (change < 0):
        return _number_of(abs(value), m)
    return f"a {_number_of(abs(value), m)} {'rise' if value > 0 else 'fall'}"


def _phrase(p: Part, change: float, m: Metric) -> str:
    if p.cause == "mix":
        w = str(p.detail["workload"])
        ref, cur = p.detail["shares"][w]
        direction = "to" if p.detail["toward"] else "away from"
        moved = f"{_pct(ref)} -> {_pct(cur)} of {m.tokens}"
        return f"{_amount(p.value, change, m)} from the mix moving {direction} {w} ({moved})"
    workload = p.workload if p.workload is not None else "the other workloads"
    return _within_phrase(p.value, workload, p.detail, change, m)


def _within_phrase(value: float, workload: str, detail: dict[str, Any], change: float, m: Metric) -> str:
    return f"{_amount(value, change, m)} within {workload} ({_rates(detail['rate_ref'], detail['rate_cur'], m)})"


def _cause_phrase(p: Part, within: float, m: Metric) -> str:
    """A Level 2 part: the cause, the cell that moved most, and as much causality as the data shows."""
    amount = _amount(p.value, within, m)
    lead = str(p.detail["lead"])
    cell = p.detail["cells"][lead]
    if p.detail.get("same_window") and p.cause in ("version", "health"):
        versus = str(p.detail["versus"])
        other = p.detail["cells"][versus]
        return (
            f"{amount} from {p.cause}: {lead} at {_number_of(cell['rate_cur'], m)} against "
            f"{_number_of(other['rate_cur'], m)} for {versus} in the same window"
        )
    moved = f"{lead} {_pct(cell['share_ref'])} -> {_pct(cell['share_cur'])} of {m.tokens}"
    if p.cause == "version":
        return f"{amount} coinciding with a change of version ({moved}, not side by side)"
    if p.cause == "health":
        # Not identified: no other replica, nor the same one restarted, served beside it to tell age from load.
        return f"{amount} coinciding with uptime and KV use together ({moved}, no replica beside it to tell them apart)"
    return f"{amount} from {p.cause} ({moved}, {m.title.lower()} {_number_of(cell['rate'], m)} there)"


def _pct(share: float) -> str:
    return f"{share:.0%}".replace("%", " %")


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None
