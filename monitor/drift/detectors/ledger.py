"""The speculation ledger: what speculation saved or cost per workload and load level over a window.

At equal concurrency a token decoded speculatively takes 1/r of the plain replica's time per token
(r: :mod:`~monitor.drift.detectors.crossover`'s ratio at that load), so the replica-seconds saved
per token are ``t_plain (1 - 1/r) = t_plain - t_spec``, summed over the speculative decode tokens
served at that load (every one in the window, summed in SQL; the ratio comes from the samples).
The interval is the ratio's carried through (``1 - 1/r`` rises with r); the total's comes from the
levels' bootstrap draws summed, the levels resampled independently. A level without a ratio
(too few a side, no plain company at its load) or tokens without a recorded load get no figure:
they are counted as ``tokens_unvalued``, never priced at a neighbour's rate.

Money: a replica-hour has a price per pool (``--price speculative=USD --price baseline=USD``, the
pools as ``proxy.upstream`` and ``proxy.baseline_upstream`` are named in the proxy's logs and
``draftwatch_proxy_upstream_up``), and serving a token plain costs ``t_plain x baseline price``
where speculation cost ``t_spec x speculative price``: with equal prices the money is the
seconds times the price / 3600.

>>> from monitor.drift.detectors.crossover import Level
>>> level = Level(1, 2, 60, 40, ratio=1.25, low=1.1, high=1.4, plain_ms=20.0, spec_ms=16.0)
>>> b = bill_level(level, tokens=36_000, prices={"speculative": 3.6, "baseline": 3.6})
>>> round(b.seconds, 1), round(b.seconds_low, 1), round(b.seconds_high, 1), round(b.usd or 0, 3)
(144.0, 65.5, 205.7, 0.144)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.engine import Engine

from monitor.drift.detectors.crossover import Curve, Level, levels_of, load_curve
from monitor.drift.detectors.net_loss import Population
from monitor.drift.sampling import sample_requests, window_counts
from monitor.drift.settings import PRICED_POOLS, DriftSettings
from monitor.drift.stats import FloatArray, percentile_interval
from monitor.store.reads.ledger import speculative_tokens
from monitor.store.reads.results import Pair


def usd_of(seconds_saved_ms: float, plain_ms: float, prices: Mapping[str, float] | None) -> float | None:
    """Money saved per token-time: plain time at the baseline's price less speculative time at the speculative one's.

    ``seconds_saved_ms`` is ``tokens x (t_plain - t_spec)`` and ``plain_ms`` ``tokens x t_plain``, in ms.
    None without a price for both pools.
    """
    if not prices or any(pool not in prices for pool in PRICED_POOLS):
        return None
    spec_ms = plain_ms - seconds_saved_ms
    return (plain_ms * prices["baseline"] - spec_ms * prices["speculative"]) / 1000.0 / 3600.0


@dataclass(frozen=True, slots=True)
class LevelBill:
    """One load level's bill: the tokens served speculatively there and what they saved (negative: cost)."""

    level: Level
    tokens: int
    seconds: float | None = None
    seconds_low: float | None = None
    seconds_high: float | None = None
    usd: float | None = None
    draws: FloatArray | None = None  # bootstrap draws of the seconds saved

    def to_json(self) -> dict[str, Any]:
        return {
            **self.level.to_json(),
            "tokens": self.tokens,
            "gpu_seconds_saved": self.seconds,
            "gpu_seconds_low": self.seconds_low,
            "gpu_seconds_high": self.seconds_high,
            "usd_saved": self.usd,
        }


def bill_level(level: Level, tokens: int, prices: Mapping[str, float] | None = None) -> LevelBill:
    """The seconds (and money) saved by ``tokens`` decode tokens served speculatively at ``level``."""
    if level.ratio is None or level.plain_ms is None or level.low is None or level.high is None:
        return LevelBill(level, tokens)
    plain = tokens * level.plain_ms  # ms of plain replica time the same tokens would have taken

    def saved(r: float | FloatArray) -> Any:
        return plain * (1.0 - 1.0 / r) / 1000.0

    draws = saved(level.draws) if level.draws is not None else None
    seconds = saved(level.ratio)
    usd = usd_of(seconds * 1000.0, plain, prices)
    return LevelBill(level, tokens, float(seconds), float(saved(level.low)), float(saved(level.high)), usd, draws)


def call_of(low: float | None, high: float | None) -> str:
    """``saves``, ``costs``, ``inconclusive`` (the interval spans 0) or ``not_measured``."""
    if low is None or high is None:
        return "not_measured"
    return "saves" if low > 0 else "costs" if high < 0 else "inconclusive"


@dataclass(frozen=True, slots=True)
class Totals:
    tokens: int
    tokens_unvalued: int
    seconds: float | None
    low: float | None
    high: float | None
    usd: float | None

    @classmethod
    def of(cls, bills: Sequence[LevelBill], unvalued: int, ci_level: float) -> Totals:
        valued = [b for b in bills if b.seconds is not None]
        tokens = sum(b.tokens for b in bills) + unvalued
        unvalued += sum(b.tokens for b in bills if b.seconds is None)
        if not valued:
            return cls(tokens, unvalued, None, None, None, None)
        drawn = [b.draws for b in valued if b.draws is not None]
        low, high = percentile_interval(np.sum(drawn, axis=0), ci_level) if len(drawn) == len(valued) else (None, None)
        usd = [b.usd for b in valued]
        money = None if any(u is None for u in usd) else float(sum(u for u in usd if u is not None))
        return cls(tokens, unvalued, float(sum(b.seconds or 0.0 for b in valued)), low, high, money)

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "tokens_unvalued": self.tokens_unvalued,
            "gpu_seconds_saved": self.seconds,
            "gpu_seconds_low": self.low,
            "gpu_seconds_high": self.high,
            "usd_saved": self.usd,
            "call": call_of(self.low, self.high),
        }


@dataclass(frozen=True, slots=True)
class WorkloadLedger:
    """One workload and pair: the curve, each level's bill and the totals."""

    workload: str
    pair: Pair
    baseline: str | None  # "holdout" (its own), "target_plain" (an estimate), None (none)
    curve: Curve
    bills: list[LevelBill]
    totals: Totals
    note: str

    def to_json(self) -> dict[str, Any]:
        crossover = self.curve.crossover
        return {
            "workload": self.workload,
            "pair": self.pair.label,
            "baseline": self.baseline,
            "levels": [b.to_json() for b in self.bills],
            "crossover": crossover.to_json() if crossover else None,
            "note": self.note,
            **self.totals.to_json(),
        }


def bill_workload(
    workload: str,
    pair: Pair,
    baseline: str | None,
    curve: Curve,
    tokens: Iterable[tuple[float | None, int, int]],
    prices: Mapping[str, float] | None,
    ci_level: float = 0.95,
) -> WorkloadLedger:
    """Apply the curve to the tokens served per in-flight count (as ``speculative_tokens`` reads them)."""
    per_level = [0] * len(curve.levels)
    unvalued = 0
    for inflight, _n, count in tokens:
        (index,) = levels_of(np.array([np.nan if inflight is None else inflight]), curve.levels)
        if index < 0:
            unvalued += count
        else:
            per_level[index] += count
    bills = [bill_level(level, n, prices) for level, n in zip(curve.levels, per_level, strict=True)]
    return WorkloadLedger(workload, pair, baseline, curve, bills, Totals.of(bills, unvalued, ci_level), curve.note)


@dataclass(frozen=True, slots=True)
class Ledger:
    start: datetime
    end: datetime
    workloads: list[WorkloadLedger]
    prices: Mapping[str, float]
    ci_level: float = 0.95

    @property
    def total(self) -> Totals:
        rows = [w.totals for w in self.workloads]
        valued = [b for w in self.workloads for b in w.bills if b.seconds is not None]
        drawn = [b.draws for b in valued if b.draws is not None]
        tokens, unvalued = sum(t.tokens for t in rows), sum(t.tokens_unvalued for t in rows)
        if not valued:
            return Totals(tokens, unvalued, None, None, None, None)
        complete = len(drawn) == len(valued)
        low, high = percentile_interval(np.sum(drawn, axis=0), self.ci_level) if complete else (None, None)
        usd = [t.usd for t in rows if t.seconds is not None]
        money = None if any(u is None for u in usd) else float(sum(u for u in usd if u is not None))
        return Totals(tokens, unvalued, float(sum(t.seconds or 0.0 for t in rows)), low, high, money)

    def to_json(self) -> dict[str, Any]:
        empty = f"nothing to bill: no speculative request between {self.start.isoformat()} and {self.end.isoformat()}"
        return {
            "window": {"start": self.start.isoformat(), "end": self.end.isoformat()},
            "note": None if self.workloads else empty,
            "prices": dict(self.prices),
            "workloads": [w.to_json() for w in self.workloads],
            "total": self.total.to_json(),
        }


def read_ledger(
    engine: Engine,
    config: DriftSettings,
    start: datetime,
    end: datetime,
    prices: Mapping[str, float] | None = None,
    *,
    workload: str | None = None,
) -> Ledger:
    """The ledger of every workload and pair that decoded speculatively in ``[start, end)``.

    The baseline is the workload's own holdout where it has ``drift.min_requests`` timed requests in
    the window, else (flagged ``target_plain``: an estimate, the controller chose those requests) the
    target's plain and holdout requests of every workload.
    """
    size, least = config.sample_size, config.min_requests
    found: list[WorkloadLedger] = []
    with engine.connect() as conn:
        counts = window_counts(conn, start, start, end).cur
        pairs = sorted(key for key, modes in counts.items() if modes.get("speculative"))
        targets: dict[str, Population] = {}
        for name, pair in pairs:
            if workload is not None and name != workload:
                continue
            spec = Population.timed(sample_requests(conn, name, pair, start, end, size, mode="speculative"))
            held_out = sample_requests(conn, name, pair, start, end, size, mode="holdout", any_drafter=True)
            plain = Population.timed(held_out)
            baseline: str | None = "holdout"
            if len(plain.ms) < least:
                if pair.target_model not in targets:
                    read = sample_requests(
                        conn, None, pair, start, end, size, mode=("holdout", "plain"), any_drafter=True
                    )
                    targets[pair.target_model] = Population.timed(read)
                plain, baseline = targets[pair.target_model], "target_plain"
            curve = load_curve(spec, plain, min_side=least, n_boot=config.n_boot, ci_level=config.ci_level)
            if len(plain.ms) == 0:
                baseline = None
                why = (
                    f"no baseline: no timed holdout or plain request of {pair.target_model} between "
                    f"{start.isoformat()} and {end.isoformat()} (proxy.baseline_upstream measures one)"
                )
                curve = dataclasses.replace(curve, crossover=None, note=why)
            elif baseline == "target_plain":
                said = f"estimate against the target's plain decoding (fewer than {least} timed holdout requests)"
                curve = dataclasses.replace(curve, note=f"{curve.note}; {said}")
            tokens = speculative_tokens(conn, name, pair, start, end)
            found.append(bill_workload(name, pair, baseline, curve, tokens, prices, config.ci_level))
    return Ledger(start, end, found, dict(prices or {}), config.ci_level)
