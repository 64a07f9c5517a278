"""The drift run's settings (the ``drift.*`` rows) and the constants of its tests.

>>> c = DriftSettings(workload_floors=parse_workload_floors("chat:acceptance=0.08"))
>>> c.floor("chat", "acceptance"), c.floor("code", "acceptance"), c.fdr_level
(0.08, 0.05, 0.01)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from monitor.settings.fields import setting
from monitor.settings.parsers import parse_duration, parse_fraction, parse_int, parse_ratio

# The keys a per-workload floor may set, e.g. "chat:acceptance=0.08,latency=0.2;code:acceptance=0.1".
FLOOR_KEYS: Final = ("acceptance", "latency", "psi")
WorkloadFloors = tuple[tuple[str, str, float], ...]


def parse_workload_floors(raw: Any) -> WorkloadFloors:
    if not isinstance(raw, str):
        raise ValueError("expected a string like 'chat:acceptance=0.08,latency=0.2;code:acceptance=0.1'")
    found: list[tuple[str, str, float]] = []
    for part in filter(None, (p.strip() for p in raw.split(";"))):
        workload, _, assignments = part.partition(":")
        for assignment in filter(None, (a.strip() for a in assignments.split(","))):
            key, _, value = assignment.partition("=")
            if not workload.strip() or key.strip() not in FLOOR_KEYS:
                raise ValueError(f"expected WORKLOAD:KEY=VALUE with KEY one of {', '.join(FLOOR_KEYS)}")
            try:
                found.append((workload.strip(), key.strip(), float(value)))
            except ValueError:
                raise ValueError(f"expected a number after {key.strip()}=") from None
    return tuple(found)


# The pools a ledger prices: the speculative replicas and the plain baseline beside them.
PRICED_POOLS: Final = ("speculative", "baseline")


def parse_price(text: str) -> tuple[str, float]:
    """``POOL=USD_PER_HOUR`` -> (pool, price); ValueError names what is wrong.

    >>> parse_price("baseline=2.5")
    ('baseline', 2.5)
    >>> parse_price("gpu=2")
    Traceback (most recent call last):
    ValueError: unknown pool 'gpu': expected POOL=USD_PER_HOUR with POOL one of speculative, baseline
    """
    pool, sep, value = text.partition("=")
    pool = pool.strip()
    if not sep or pool not in PRICED_POOLS:
        what = f"unknown pool {pool!r}" if sep else f"{text!r}"
        raise ValueError(f"{what}: expected POOL=USD_PER_HOUR with POOL one of {', '.join(PRICED_POOLS)}")
    try:
        price = float(value)
    except ValueError:
        raise ValueError(f"{text!r}: the price after = must be a number of USD per replica-hour") from None
    if not math.isfinite(price) or price < 0:
        raise ValueError(f"{text!r}: the price must be a finite number of USD per replica-hour, 0 or more")
    return pool, price


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftSettings:
    current_window: timedelta = setting(
        "drift.current_window",
        parse_duration,
        timedelta(hours=1),
        "length of the current window of a drift run, e.g. 15m, 6h",
    )
    max_current_window: timedelta = setting(
        "drift.max_current_window",
        parse_duration,
        timedelta(hours=8),
        "longest the current window of a workload widens to (doubling) while it holds fewer than drift.min_requests "
        "speculative requests; equal to drift.current_window turns widening off",
    )
    reference_window: timedelta = setting(
        "drift.reference_window",
        parse_duration,
        timedelta(days=1),
        "length of the rolling reference window just before the current one",
    )
    fdr_level: float = setting(
        "drift.fdr_level",
        parse_fraction,
        0.01,
        "Benjamini-Hochberg false-discovery level across one drift run",
    )
    min_requests: int = setting(
        "drift.min_requests",
        parse_int(5),
        30,
        "fewest requests per window for a test to decide; fewer gives insufficient_data",
    )
    sample_size: int = setting(
        "drift.sample_size",
        parse_int(50),
        2000,
        "most requests read per window and workload (a deterministic hash sample)",
    )
    explain_min_requests: int = setting(
        "drift.explain_min_requests",
        parse_int(5),
        30,
        "fewest drafting requests a workload needs in each window to get its own part in the acceptance split; "
        "thinner workloads are merged into one 'other' cell",
    )
    acceptance_floor: float = setting(
        "drift.acceptance_floor",
        parse_fraction,
        0.05,
        "smallest change of mean per-request acceptance that counts as drift (default: 0.05 = 5 points)",
    )
    latency_floor: float = setting(
        "drift.latency_floor",
        parse_ratio,
        0.10,
        "smallest relative rise of p95 latency (ms per token, TTFT, end-to-end) that counts",
    )
    workload_floors: WorkloadFloors = setting(
        "drift.workload_floors",
        parse_workload_floors,
        (),
        "per-workload floors, 'chat:acceptance=0.08,latency=0.2;code:psi=0.5' (keys: acceptance, latency, psi)",
    )
    # The tests' own constants: not settings, but a test may change them.
    psi_floor: float = 0.25
    mix_floor: float = 0.10
    n_boot: int = 500
    ci_level: float = 0.95
    # Online detector: per-run cap on new requests fed per workload and pair (the newest ones).
    detector_batch: int = 5000

    @property
    def min_holdout(self) -> int:
        """Holdout requests the measured net-loss test needs: as many as any other test's window."""
        return self.min_requests

    @property
    def floors(self) -> dict[str, float]:
        return {
            "acceptance": self.acceptance_floor,
            "latency": self.latency_floor,
            "psi": self.psi_floor,
            "mix": self.mix_floor,
        }

    def floor(self, workload: str | None, key: str) -> float:
        """The floor of ``key`` for ``workload``: its own override (the last one given), else the default."""
        own = [value for name, k, value in self.workload_floors if name == workload and k == key]
        return own[-1] if own else self.floors[key]
