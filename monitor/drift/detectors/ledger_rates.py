"""The ledger's rates per workload and load level, as the scheduler stores them for every sidecar's counters.

A sidecar values each speculative token it records at its workload's rate at its load level
(``draftwatch_speculation_gpu_seconds_saved_total`` and its companions). The rates come from the
ledger over the last :data:`LEDGER_WINDOW`: a read of every speculative request of a day with
bootstrap intervals, seconds of Python on a large store. Computed in a sidecar, that read held
its event loop; so the scheduler's drift job computes them once per run for the whole fleet and
stores them with the run (``drift_runs.ledger_rates``), and a sidecar reads the newest ones, a
single small row.

>>> from datetime import UTC, datetime
>>> rates = LedgerRates({"chat": [(1, 2, 0.004, "gains"), (4, 8, None, "not_measured")]},
...                     {("chat", "qwen/ngram"): 4.0})
>>> LedgerRates.from_json(rates.to_json()) == rates
True
>>> rates.rate("chat", 2), rates.rate("chat", 16), rates.rate("code", 1)
((0.004, 'gains'), None, None)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from monitor.drift.detectors.crossover import Level
from monitor.drift.detectors.ledger import Ledger
from monitor.drift.models import DriftRunRow

# The ledger the rates are read from: a day, so that every load level a day's traffic reaches has its rate.
LEDGER_WINDOW: Final = timedelta(days=1)

# A level's rate: its doubling levels (first, last), replica-seconds saved per token (negative: lost), its call.
Rate = tuple[int, int, float | None, str]


@dataclass(frozen=True, slots=True)
class LedgerRates:
    """Each workload's rates by level, and each (workload, pair)'s crossover in flight (NaN: none seen)."""

    rates: dict[str, list[Rate]] = field(default_factory=dict)
    crossover: dict[tuple[str, str], float] = field(default_factory=dict)

    def rate(self, workload: str, level: int) -> tuple[float | None, str] | None:
        """The rate per token and the call at ``level`` for ``workload``; None where no level covers it."""
        found = next((r for r in self.rates.get(workload, ()) if r[0] <= level <= r[1]), None)
        return (found[2], found[3]) if found is not None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "rates": {workload: [list(rate) for rate in levels] for workload, levels in self.rates.items()},
            "crossover": [[w, p, None if math.isnan(v) else v] for (w, p), v in self.crossover.items()],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LedgerRates:
        rates = {w: [(int(a), int(b), None if r is None else float(r), str(c)) for a, b, r, c in levels]
                 for w, levels in data.get("rates", {}).items()}  # fmt: skip
        crossover = {(w, p): math.nan if v is None else float(v) for w, p, v in data.get("crossover", [])}
        return cls(rates, crossover)


def ledger_rates(ledger: Ledger) -> LedgerRates:
    """The rates of ``ledger``; a workload served by several pairs is valued at the rates of the pair that served
    most, and the rates keep the ledger's order of workloads, the busiest first."""
    rates: dict[str, list[Rate]] = {}
    crossover: dict[tuple[str, str], float] = {}
    for w in sorted(ledger.workloads, key=lambda w: -w.totals.tokens):
        cross = w.curve.crossover
        crossover[(w.workload, w.pair.label)] = math.nan if cross is None else float(cross.inflight)
        if w.workload not in rates:
            rates[w.workload] = [_rate(b.level) for b in w.bills]
    return LedgerRates(rates, crossover)


def _rate(level: Level) -> Rate:
    per_token = None if level.plain_ms is None or level.spec_ms is None else (level.plain_ms - level.spec_ms) / 1000
    return level.first, level.last, per_token, level.call


def store_ledger_rates(conn: Connection, run_id: str, rates: LedgerRates) -> None:
    """Keep ``rates`` with the drift run ``run_id``."""
    conn.execute(update(DriftRunRow).where(DriftRunRow.run_id == run_id).values(ledger_rates=rates.to_json()))


def newest_ledger_rates(conn: Connection) -> LedgerRates | None:
    """The rates the newest drift run that computed them stored; None before any did."""
    r = DriftRunRow
    # Newest by the key, which grows with every run stored: read backwards along its index, not a sort of them all.
    found = conn.execute(
        select(r.ledger_rates).where(r.ledger_rates.is_not(None)).order_by(r.id.desc()).limit(1)
    ).scalar_one_or_none()
    return LedgerRates.from_json(found) if found is not None else None
