"""The verdict: is speculation paying on this workload? Read off the net-loss test's speedup interval.

* ``pays``: the interval's lower bound is above 1: speculation is faster, beyond doubt at the test's level.
* ``net_loss``: the test decided ``drift`` (measured: q below the level and the upper bound below 1;
  estimate: the upper bound below 1): speculation is slower than plain decoding.
* ``inconclusive``: neither, with why: too few requests on a side, strata that do not overlap
  (speculative and plain requests ran at different loads or context lengths), or an interval that
  holds 1.
* ``not_measured``: no plain requests at all; the speedup cannot be measured until a baseline exists.

>>> from monitor.drift.result import DriftResult
>>> r = DriftResult(test="net_loss", metric="speedup", n_ref=40, n_cur=120, statistic=-3.0, p=0.001, effect=0.45,
...                 ci=(0.38, 0.53), decision="drift", workload="qa")
>>> v = verdict_of(r); v.verdict, v.speedup, v.measured
('net_loss', 0.45, True)
>>> verdict_of(r.replace(effect=1.3, ci=(1.1, 1.5), decision="no_drift")).verdict
'pays'
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from sqlalchemy.engine import Engine

from monitor.drift.queries import latest_results
from monitor.drift.result import DriftResult

VerdictName = Literal["pays", "net_loss", "inconclusive", "not_measured"]
VERDICTS: Final = ("pays", "net_loss", "inconclusive", "not_measured")
# What a deployment without plain requests is told, wherever the verdict is shown.
HOW_TO_MEASURE: Final = (
    "not measured: no plain requests to compare with. Serve the same model without speculation and add it as a "
    "baseline (draftwatch serve --upstream SPEC_URL --baseline-upstream PLAIN_URL), or let the embedded decoder's "
    "holdout run (decoder.holdout_share)"
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One workload and pair's verdict with the figures behind it."""

    workload: str
    pair: str | None
    verdict: VerdictName
    reason: str
    speedup: float | None = None
    ci: tuple[float, float] | None = None
    measured: bool = False  # the workload's own holdout or baseline, not an estimate from other workloads
    n_speculative: int = 0
    n_plain: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "speedup": self.speedup,
            "ci": list(self.ci) if self.ci else None,
            "measured": self.measured,
            "pair": self.pair,
            "n_speculative": self.n_speculative,
            "n_plain": self.n_plain,
        }


def interval_verdict(low: float, high: float) -> VerdictName:
    """The verdict a speedup interval gives alone: above 1 ``pays``, below 1 ``net_loss``, else ``inconclusive``.

    >>> interval_verdict(1.1, 1.4), interval_verdict(0.4, 0.9), interval_verdict(0.9, 1.2)
    ('pays', 'net_loss', 'inconclusive')
    """
    return "pays" if low > 1.0 else "net_loss" if high < 1.0 else "inconclusive"


def busiest(verdicts: Iterable[Verdict]) -> dict[str, Verdict]:
    """Per workload, the verdict of its busiest pair (most speculative requests): the one it is shown and routed by."""
    chosen: dict[str, Verdict] = {}
    for v in verdicts:
        if v.workload not in chosen or v.n_speculative > chosen[v.workload].n_speculative:
            chosen[v.workload] = v
    return chosen


def verdict_of(result: DriftResult) -> Verdict:
    """The verdict of one stored ``net_loss`` result (see the module docstring)."""
    base = Verdict(result.workload or "", result.pair, "inconclusive", "", n_speculative=result.n_cur,
                   n_plain=result.n_ref)  # fmt: skip
    if result.decision == "insufficient_data" or result.ci is None or result.effect is None:
        if result.n_ref == 0:
            return replace(base, verdict="not_measured", reason=HOW_TO_MEASURE)
        why = result.detail.get("inconclusive") or (
            f"too few requests: {result.n_cur} speculative and {result.n_ref} plain with a decode time "
            f"({result.note or 'a minimum per side'})"
        )
        return replace(base, reason=str(why))
    measured = not result.detail.get("estimate", False)
    low, high = result.ci
    base = replace(base, speedup=result.effect, ci=(low, high), measured=measured)
    source = "measured on its own baseline" if measured else "estimated from the target's plain traffic"
    # A net loss needs the test's decision (for the measured form q below the level too), not the interval alone.
    if result.decision == "drift":
        return replace(base, verdict="net_loss", reason=f"speculation is slower ({source}): {_interval(result)}")
    if interval_verdict(low, high) == "pays":
        return replace(base, verdict="pays", reason=f"speculation is faster ({source}): {_interval(result)}")
    return replace(base, reason=f"no verdict at the test's level ({source}): {_interval(result)}")


def latest_verdicts(engine: Engine) -> list[Verdict]:
    """The verdict of every workload and pair in the newest drift run."""
    return [verdict_of(stored.result) for stored in latest_results(engine, test="net_loss")]


def _interval(result: DriftResult) -> str:
    low, high = result.ci or (float("nan"), float("nan"))
    return f"{result.effect:.2f}x [{low:.2f}, {high:.2f}]"
