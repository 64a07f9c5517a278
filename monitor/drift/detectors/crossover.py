"""The load crossover: speculation's decode speed against plain decoding per load level, and where it turns.

At each load level (``upstream_inflight``, the requests a replica had in flight when a request
started, in :func:`~monitor.drift.detectors.net_loss.load_level`'s doubling levels) the ratio

    r = plain ms per token / speculative ms per token        (r > 1: speculation is faster)

is measured like the net-loss verdict measures it (:class:`~monitor.drift.detectors.net_loss.Strata`:
within a level, strata of load and context length, weighted by the speculative requests), with a
request-level bootstrap interval whose resampling patterns are fixed per level, so that the same
data always gives the same interval.

Levels adapt to the traffic seen: adjacent doubling levels are merged, from the lowest load up,
until a merged level holds at least ``min_side`` requests of each kind; what is left at the top
below that minimum is reported as a level of its own with no ratio ("too few a side"), never merged
into a measured level (that would measure a high load's speculative requests against a lower
load's plain ones, the bias the strata exist to remove).

The crossover is the lowest load at which speculation loses (the level's interval entirely below
1) after a level where it gains or ties, each level judged here at the Bonferroni level across the
curve's measured levels, so that a tie at every load claims a crossover at most 1 - ``ci_level`` of
the time (at each level's own 95 %, four tied levels claimed one in 22 of 200 seeded runs). Its
uncertainty is the bracket from the lowest load of the last level where speculation gained
(interval above 1; the first measured level when none did) to the highest load of the first level
where it loses: a level that ties may hold the turn or lie above it, so only a gain bounds it from
below. No level losing gives no crossover ("none seen up to N"); every measured level losing gives
none either (speculation loses at every load measured).

>>> rng = np.random.default_rng(3)
>>> load = np.repeat([1.0, 2.0, 4.0, 8.0], 60)
>>> spec = Population(rng.lognormal(0, 0.1, 240) * (10 + 3 * load), np.full(240, 300.0), load)
>>> plain = Population(rng.lognormal(0, 0.1, 240) * (14 + 1 * load), np.full(240, 300.0), load)
>>> curve = load_curve(spec, plain, min_side=30, n_boot=200)
>>> [(lv.inflight_low, lv.inflight_high, round(lv.ratio or 0, 2)) for lv in curve.levels]
[(1, 1, 1.18), (2, 3, 1.0), (4, 7, 0.82), (8, 15, 0.65)]
>>> curve.crossover
Crossover(inflight=4, low=1, high=7)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from monitor.drift.detectors.net_loss import MIN_COVERAGE, Population, Strata, load_level
from monitor.drift.stats import FloatArray, percentile_interval

THIN: Final = "too few a side"


def level_bounds(level: int) -> tuple[int, int]:
    """The in-flight counts of a doubling level: 1 -> (1, 1), 2 -> (2, 3), 3 -> (4, 7), ...

    >>> [level_bounds(n) for n in (1, 2, 4)]
    [(1, 1), (2, 3), (8, 15)]
    """
    return 2 ** (level - 1), 2**level - 1


@dataclass(frozen=True, slots=True)
class Level:
    """One (possibly merged) load level: the requests of each kind in it and, where measured, the ratio."""

    first: int  # the doubling levels it spans, first to last
    last: int
    n_spec: int
    n_plain: int
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    plain_ms: float | None = None  # the plain time per token at this load, for the speculative traffic's context mix
    spec_ms: float | None = None
    note: str | None = None
    draws: FloatArray | None = field(default=None, repr=False, compare=False)
    # The interval at the level that holds across every measured level of the curve (Bonferroni), for the crossover.
    family: tuple[float, float] | None = field(default=None, repr=False, compare=False)

    @property
    def inflight_low(self) -> int:
        return level_bounds(self.first)[0]

    @property
    def inflight_high(self) -> int:
        return level_bounds(self.last)[1]

    @property
    def measured(self) -> bool:
        return self.ratio is not None

    @property
    def loses(self) -> bool:
        """Speculation is slower here: the whole interval lies below 1."""
        return self.high is not None and self.high < 1.0

    @property
    def gains(self) -> bool:
        return self.low is not None and self.low > 1.0

    @property
    def family_loses(self) -> bool:
        return self.family[1] < 1.0 if self.family is not None else self.loses

    @property
    def family_gains(self) -> bool:
        return self.family[0] > 1.0 if self.family is not None else self.gains

    @property
    def call(self) -> str:
        """``gains``, ``loses``, ``inconclusive`` (the interval spans 1) or ``not_measured``."""
        if not self.measured:
            return "not_measured"
        return "gains" if self.gains else "loses" if self.loses else "inconclusive"

    def to_json(self) -> dict[str, Any]:
        return {
            "inflight_low": self.inflight_low,
            "inflight_high": self.inflight_high,
            "ratio": self.ratio,
            "low": self.low,
            "high": self.high,
            "n_spec": self.n_spec,
            "n_plain": self.n_plain,
            "call": self.call,
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class Crossover:
    """The lowest load at which speculation loses, and the bracket the turn lies in."""

    inflight: int
    low: int
    high: int

    def to_json(self) -> dict[str, int]:
        return {"inflight": self.inflight, "low": self.low, "high": self.high}


@dataclass(frozen=True, slots=True)
class Curve:
    """A workload's ratio per load level, its crossover, and what the levels could not use."""

    levels: list[Level]
    crossover: Crossover | None
    note: str

    @property
    def measured(self) -> list[Level]:
        return [lv for lv in self.levels if lv.measured]


def load_curve(
    spec: Population, plain: Population, *, min_side: int = 30, n_boot: int = 500, ci_level: float = 0.95
) -> Curve:
    """The ratio per adapted load level and the crossover (module docstring)."""
    spec, plain = spec.as_floats(), plain.as_floats()
    spec_level, plain_level = spec.levels, plain.levels
    unknown = int((spec_level == 0).sum())
    levels = [
        _measure(spec, plain, spec_level, plain_level, first, last, n_boot, ci_level)
        if min(n_s, n_p) >= min_side
        else Level(first, last, n_s, n_p, note=f"{THIN}: {n_s} speculative, {n_p} plain, {min_side} needed")
        for first, last, n_s, n_p in _buckets(spec_level, plain_level, min_side)
    ]
    # The crossover is a claim about the first of several levels: each is judged at the level that keeps the
    # whole curve's chance of a false loss within 1 - ci_level (a tie at four levels otherwise shows one in ten).
    measured = sum(lv.draws is not None for lv in levels)
    family_level = 1.0 - (1.0 - ci_level) / max(measured, 1)
    levels = [
        dataclasses.replace(lv, family=percentile_interval(lv.draws, family_level)) if lv.draws is not None else lv
        for lv in levels
    ]
    return Curve(levels, find_crossover(levels), _describe(levels, min_side, unknown))


def _buckets(
    spec_level: np.ndarray[Any, np.dtype[np.int64]], plain_level: np.ndarray[Any, np.dtype[np.int64]], min_side: int
) -> list[tuple[int, int, int, int]]:
    """Adjacent doubling levels merged upwards until each bucket holds ``min_side`` of both kinds."""
    present = sorted({int(x) for x in np.concatenate([spec_level, plain_level]) if x > 0})
    buckets: list[tuple[int, int, int, int]] = []
    start, n_s, n_p = None, 0, 0
    for level in present:
        start = level if start is None else start
        n_s += int((spec_level == level).sum())
        n_p += int((plain_level == level).sum())
        if n_s >= min_side and n_p >= min_side:
            buckets.append((start, level, n_s, n_p))
            start, n_s, n_p = None, 0, 0
    if start is not None:
        buckets.append((start, present[-1], n_s, n_p))
    return buckets


def _measure(
    spec: Population,
    plain: Population,
    spec_level: np.ndarray[Any, np.dtype[np.int64]],
    plain_level: np.ndarray[Any, np.dtype[np.int64]],
    first: int,
    last: int,
    n_boot: int,
    ci_level: float,
) -> Level:
    s = (spec_level >= first) & (spec_level <= last)
    p = (plain_level >= first) & (plain_level <= last)
    n_s, n_p = int(s.sum()), int(p.sum())
    assert spec.load is not None and plain.load is not None  # levels above 0 come from known loads
    strata = Strata.split(
        Population(spec.ms[s], spec.ctx[s], np.asarray(spec.load)[s]),
        Population(plain.ms[p], plain.ctx[p], np.asarray(plain.load)[p]),
    )
    if strata.coverage < MIN_COVERAGE:
        shared = strata.used()[0]
        why = f"no like-for-like: {shared} of {n_s} speculative requests share a load and context with plain ones"
        return Level(first, last, n_s, n_p, note=why)
    plain_ms, spec_ms = strata.means()
    draws = strata.speedup_draws(n_boot, f"load{first}-{last}-")
    low, high = percentile_interval(draws, ci_level)
    return Level(first, last, n_s, n_p, plain_ms / spec_ms, low, high, plain_ms, spec_ms, draws=draws)


def find_crossover(levels: list[Level]) -> Crossover | None:
    """The first losing level after one that gains or ties, bracketed by the last such level (module docstring)."""
    held: Level | None = None  # the last level that gained or tied
    gained: Level | None = None  # the last that gained: the turn lies above its lowest load
    for level in levels:
        if not level.measured:
            continue
        if level.family_loses and held is not None:
            start = gained or next(lv for lv in levels if lv.measured)
            return Crossover(level.inflight_low, start.inflight_low, level.inflight_high)
        if not level.family_loses:
            held = level
            gained = level if level.family_gains else gained
    return None


def _describe(levels: list[Level], min_side: int, unknown: int) -> str:
    """One line: the crossover or why there is none, and how the levels were formed."""
    measured = [lv for lv in levels if lv.measured]
    crossover = find_crossover(levels)
    if not levels:
        said = "no request with a recorded load: the curve needs upstream_inflight (proxy mode)"
    elif not measured:
        said = f"no level has {min_side} requests a side with plain company at its load: no ratio measured"
    elif crossover is not None:
        said = (
            f"speculation loses from {crossover.inflight} in flight (the turn lies between {crossover.low} and "
            f"{crossover.high})"
        )
    elif all(lv.family_loses for lv in measured):
        low, high = measured[0].inflight_low, measured[-1].inflight_high
        said = f"speculation loses at every load measured (from {low} to {high} in flight)"
    else:
        said = f"none seen up to {measured[-1].inflight_high} in flight"
    merged = [f"{lv.inflight_low}-{lv.inflight_high}" for lv in levels if lv.last > lv.first]
    if merged:
        said += f"; levels merged to reach {min_side} a side: {', '.join(merged)}"
    if unknown:
        said += f"; {unknown} speculative requests without a recorded load left out"
    return said


def levels_of(inflight: FloatArray, levels: list[Level]) -> np.ndarray[Any, np.dtype[np.intp]]:
    """The index in ``levels`` of each in-flight count's level, -1 where none holds it (unknown load, unseen level)."""
    raw = load_level(np.asarray(inflight, dtype=float))
    index = np.full(len(raw), -1, dtype=np.intp)
    for i, level in enumerate(levels):
        index[(raw >= level.first) & (raw <= level.last)] = i
    return index
