"""The verdict: is speculation paying on this workload? Read off the net-loss test's speedup interval.

* ``pays``: the interval's lower bound is above 1: speculation is faster, beyond doubt at the test's level.
* ``net_loss``: the test decided ``drift`` (measured: q below the level and the upper bound below 1;
  estimate: the upper bound below 1): speculation is slower than plain decoding.
* ``inconclusive``: neither, with why: too few requests on a side (which side, and what would fill
  it), strata that do not overlap (speculative and plain requests ran at different loads or context
  lengths), or an interval that holds 1.
* ``not_measured``: one side has no request with a decode time: no speculative requests, or no
  plain ones. The reason names the side and the next step for what the run saw: a baseline to add
  only where the target has no plain request at all, never where one is configured and answering.

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
# What a target without any plain request is told.
HOW_TO_MEASURE: Final = (
    "not measured: no plain requests to compare with. Serve the same model without speculation and add it as a "
    "baseline (draftwatch serve --upstream SPEC_URL --baseline-upstream PLAIN_URL), or let the embedded decoder's "
    "holdout run (decoder.holdout_share)"
)
# What a workload the newest drift run did not test is told, wherever the verdict is shown.
NOT_TESTED: Final = (
    "not measured: the newest drift run tested no speculative requests of this workload (none in its windows, "
    "or no run yet); a run compares them with plain requests of the same model, from a baseline "
    "(--baseline-upstream) or the embedded decoder's holdout"
)
# Where a side's requests have no decode time: what gives them one.
UNTIMED: Final = (
    "a non-streamed answer without the engine's own timings has none: stream the requests, or have the engine "
    "report its timings (vLLM: --enable-per-request-metrics)"
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
        if "inconclusive" in result.detail:
            return replace(base, reason=f"{result.detail['inconclusive']}: {NO_OVERLAP}")
        sides = result.detail.get("sides")
        if isinstance(sides, dict):
            missing = _missing_side(sides)
            if missing is not None:
                return replace(base, verdict="not_measured", reason=missing)
            return replace(base, reason=_too_few(sides))
        if result.n_ref == 0:
            return replace(base, verdict="not_measured", reason=HOW_TO_MEASURE)
        return replace(base, reason=f"too few requests: {result.n_cur} speculative and {result.n_ref} plain with a "
                                    f"decode time ({result.note or 'a minimum per side'})")  # fmt: skip
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


# Where both sides are there but at different loads or context lengths.
NO_OVERLAP: Final = (
    "no like-for-like comparison yet; a baseline that takes requests at the speculative replicas' load "
    "(proxy.baseline_policy = member) and traffic of the same lengths on both sides give one"
)


def _missing_side(sides: dict[str, Any]) -> str | None:
    """Why a side is missing and what would fill it; None when both sides have requests with a decode time.

    >>> _missing_side({"speculative": 0, "speculative_timed": 0, "holdout": 20, "holdout_timed": 20,
    ...                "plain": 64, "plain_timed": 64})[:60]
    'not measured: no speculative requests of this workload in th'
    >>> _missing_side({"speculative": 20, "speculative_timed": 20, "holdout": 0, "holdout_timed": 0,
    ...                "plain": 0, "plain_timed": 0}) == HOW_TO_MEASURE
    True
    """
    if not sides.get("speculative_timed"):
        if not sides.get("speculative"):
            return ("not measured: no speculative requests of this workload in the window, only plain ones "
                    "(it is served by the baseline, or speculation is off for it); it is measured again once "
                    "speculative requests of it arrive")  # fmt: skip
        return f"not measured: {sides['speculative']} speculative requests, none with a decode time; {UNTIMED}"
    if sides.get("holdout_timed") or sides.get("plain_timed"):
        return None
    plain = int(sides.get("holdout", 0)) + int(sides.get("plain", 0))
    if plain == 0:
        return HOW_TO_MEASURE
    return f"not measured: {plain} plain requests of the target, none with a decode time; {UNTIMED}"


def _too_few(sides: dict[str, Any]) -> str:
    """Which side is short of the test's minimum, and what would fill it.

    >>> _too_few({"speculative": 40, "speculative_timed": 40, "min_speculative": 30, "holdout": 6,
    ...           "holdout_timed": 6, "plain": 6, "plain_timed": 6, "min_plain": 30})[:72]
    'too few plain requests: 6 of the workload and 6 of the target with a dec'
    """
    spec, plain, own = sides["speculative_timed"], sides["plain_timed"], sides["holdout_timed"]
    low_spec, low_plain = spec < sides["min_speculative"], max(plain, own) < sides["min_plain"]
    figures = (f"{spec} speculative (of {sides['min_speculative']}) and {own} plain of the workload, {plain} of "
               f"the target (of {sides['min_plain']}) with a decode time")  # fmt: skip
    if low_plain and not low_spec:
        return (f"too few plain requests: {own} of the workload and {plain} of the target with a decode time "
                f"(the test needs {sides['min_plain']}); more of the workload's traffic, or a larger holdout "
                "share (decoder.holdout_target, decoder.holdout_max_share), fills the plain side")  # fmt: skip
    if low_spec and not low_plain:
        return (f"too few speculative requests: {figures}; the current window widens up to "
                "drift.max_current_window to find them, or more traffic fills it")  # fmt: skip
    return f"too few requests on both sides: {figures}; more of the workload's traffic fills both"


def _interval(result: DriftResult) -> str:
    low, high = result.ci or (float("nan"), float("nan"))
    return f"{result.effect:.2f}x [{low:.2f}, {high:.2f}]"
