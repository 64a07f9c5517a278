"""One test's outcome, and the run-wide decision rule: Benjamini–Hochberg, then effect floors.

A result is ``insufficient_data`` when a window holds fewer requests than the test's minimum,
whatever its p-value would have been. Otherwise it is ``drift`` only when the BH-adjusted q-value is
below the level **and** the effect passes the test's floor (``passes_floor``); else ``no_drift``.
Results without a p-value (online detectors, speedup estimates) keep the decision their test gave.

>>> r = DriftResult(test="acceptance", metric="acceptance_rate", n_ref=200, n_cur=200, statistic=3.1, p=0.002,
...                 effect=-0.12, ci=(-0.16, -0.08), decision="no_drift", passes_floor=True)
>>> s = DriftResult(test="latency", metric="ms_per_token", n_ref=200, n_cur=200, statistic=0.4, p=0.30,
...                 effect=1.01, ci=(0.95, 1.08), decision="no_drift")
>>> [(x.test, round(x.q or 0, 3), x.decision) for x in apply_bh([r, s], level=0.01)]
[('acceptance', 0.004, 'drift'), ('latency', 0.3, 'no_drift')]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

import numpy as np

from monitor.store.types import iso

Decision = Literal["drift", "no_drift", "insufficient_data"]
DECISIONS: Final = ("drift", "no_drift", "insufficient_data")


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftResult:
    """Statistic, p, q, effect with its confidence interval, sample sizes and the decision of one test.

    Keyword-only: nine fields in a row of numbers are too easy to pass in the wrong order.
    """

    test: str
    metric: str
    n_ref: int
    n_cur: int
    statistic: float | None
    p: float | None
    effect: float | None
    ci: tuple[float, float] | None
    decision: Decision
    q: float | None = None
    passes_floor: bool = False
    workload: str | None = None
    pair: str | None = None
    note: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    ref_start: datetime | None = None
    ref_end: datetime | None = None
    cur_start: datetime | None = None
    cur_end: datetime | None = None

    def replace(self, **changes: Any) -> DriftResult:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The documented JSON shape (plus ``note``, ``detail`` and the window bounds)."""
        return {
            "test": self.test,
            "workload": self.workload,
            "pair": self.pair,
            "metric": self.metric,
            "n_ref": self.n_ref,
            "n_cur": self.n_cur,
            "statistic": _finite(self.statistic),
            "p": _finite(self.p),
            "q": _finite(self.q),
            "effect": _finite(self.effect),
            "ci": [_finite(self.ci[0]), _finite(self.ci[1])] if self.ci else None,
            "decision": self.decision,
            "note": self.note,
            "detail": self.detail,
            "windows": {
                "reference": [iso(self.ref_start), iso(self.ref_end)],
                "current": [iso(self.cur_start), iso(self.cur_end)],
            },
        }


def insufficient(test: str, metric: str, n_ref: int, n_cur: int, minimum: int) -> DriftResult:
    """The result of a test that did not run: too few requests in a window."""
    return DriftResult(
        test=test,
        metric=metric,
        n_ref=n_ref,
        n_cur=n_cur,
        statistic=None,
        p=None,
        effect=None,
        ci=None,
        decision="insufficient_data",
        note=f"fewer than {minimum} requests",
    )


def benjamini_hochberg(pvalues: Sequence[float]) -> list[float]:
    """BH-adjusted q-values (step-up, monotone, capped at 1).

    >>> [round(q, 3) for q in benjamini_hochberg([0.01, 0.04, 0.03, 0.5])]
    [0.04, 0.053, 0.053, 0.5]
    """
    p = np.asarray(pvalues, dtype=float)
    m = len(p)
    if m == 0:
        return []
    order = np.argsort(p)
    scaled = p[order] * m / np.arange(1, m + 1)
    q_sorted = np.minimum.accumulate(scaled[::-1])[::-1]
    q = np.empty(m)
    q[order] = np.minimum(q_sorted, 1.0)
    return [float(v) for v in q]


def apply_bh(results: Sequence[DriftResult], level: float) -> list[DriftResult]:
    """Adjust every p-value of the run together, then decide: q < level and effect past its floor."""
    testable = [i for i, r in enumerate(results) if r.p is not None and r.decision != "insufficient_data"]
    qs = benjamini_hochberg([results[i].p for i in testable])  # type: ignore[misc]
    out = list(results)
    for i, q in zip(testable, qs, strict=True):
        decision: Decision = "drift" if q < level and out[i].passes_floor else "no_drift"
        out[i] = out[i].replace(q=q, decision=decision)
    return out


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None
