"""The rollout judge: is a candidate drafter at least as good as the current one on this workload's traffic?

Like Kayenta's canary judge, each metric of one interval compares the candidate's requests with the
current drafter's requests of the same workload, served side by side in the same interval, and is
classified with a tolerance:

* ``decode_speed`` (critical): the candidate's speedup over the current drafter, current ms per
  token over candidate ms per token, stratified by load and context length exactly as the net-loss
  verdict is (:class:`monitor.drift.detectors.net_loss.NetLoss`, with the current drafter's
  requests in the plain requests' place). **fail** when the interval's upper bound is below
  ``1 - tolerance`` (slower by more than the tolerance, beyond doubt); **pass** when the estimate
  is at least ``1 - tolerance``; **marginal** in between (it looks slower, not yet beyond doubt).
* ``error_rate`` (critical): failed requests per request. **fail** when the candidate's rate is
  above the current one's by more than ``max_extra_errors`` and a one-sided Fisher exact test puts
  it above at the interval's level; **pass** when it is not above by more than ``max_extra_errors``.
* ``ttft`` (judged, not critical): time to first token, current mean over candidate mean, with a
  bootstrap-t interval, classified as decode speed is. A drafter that loads slowly or drafts on the
  prompt shows here. Only its **fail** holds a workload: a marginal TTFT is noise more often than
  not (a small pool's prompt cache is not the large pool's).
* ``acceptance`` (shown, not judged): accepted per drafted token of each side. It is the early
  signal, but a drafter that drafts longer accepts a smaller share and can still be faster; the
  speed it buys is what is judged.

A workload **fails** when a critical metric fails, **passes** when every critical metric passes
and no other fails, and is **marginal** otherwise; it is **unjudged** while either side has fewer than
``min_requests`` requests with a decode time (an error rate may still fail it: a candidate that
fails every request has no decode time at all). The score is the share of judged metrics that
pass, 0-100, as Kayenta's.

Error rates (``benchmarks/rollout.py``, seeded, ``docs/statistics.md``): under no change an
interval fails rarely (the upper bound must clear the tolerance); a candidate 20 % slower is
caught within two intervals at 30 requests a side.

>>> rng = np.random.default_rng(3)
>>> def side(ms: float, n: int = 60) -> Side:
...     return Side(Population(rng.lognormal(np.log(ms), 0.15, n), np.full(n, 200.0)), np.full(n, 50.0),
...                 np.full(n, 0.6), n, 0)
>>> Judge().judge("chat", side(12.5), side(10.0)).outcome   # 20 % slower
'fail'
>>> Judge().judge("chat", side(10.0), side(10.0)).outcome
'pass'
>>> Judge().judge("chat", side(10.0, n=8), side(10.0)).outcome
'unjudged'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple

import numpy as np
from scipy import stats as st

from monitor.drift.detectors.net_loss import NetLoss, Population
from monitor.drift.stats import (
    FloatArray,
    bootstrap_moments,
    percentile_interval,
    studentized_ratio_draws,
    weighted_mean_moments,
)

Outcome = Literal["pass", "marginal", "fail"]
WorkloadOutcome = Literal["pass", "marginal", "fail", "unjudged"]
CRITICAL: Final = ("decode_speed", "error_rate")
# A metric as its user reads it, where a stored judgement is said in words (:func:`in_words`).
WORDS: Final = {"decode_speed": "decode speed", "error_rate": "error rate", "ttft": "time to first token"}


class Side(NamedTuple):
    """One side's requests of a workload in an interval: the candidate's, or the current drafter's.

    ``speed``: decode ms per token with context and load (requests that have one); ``ttft``: ms of
    those with one; ``acceptance``: accepted per drafted token of those that drafted; ``n`` and
    ``errors``: every request the side ended, and the failed ones among them.
    """

    speed: Population
    ttft: FloatArray
    acceptance: FloatArray
    n: int
    errors: int


@dataclass(frozen=True, slots=True)
class MetricJudgement:
    """One metric's comparison: each side's value, the candidate's ratio to current with its interval, the class."""

    metric: str
    outcome: Outcome | None  # None: shown, not judged
    candidate: float
    current: float
    ratio: float | None = None
    ci: tuple[float, float] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "outcome": self.outcome, "candidate": self.candidate, "current": self.current,
                "ratio": self.ratio, "ci": list(self.ci) if self.ci else None}  # fmt: skip


@dataclass(frozen=True, slots=True)
class WorkloadJudgement:
    """A workload's outcome for one interval, its score (share of judged metrics passing, 0-100) and why."""

    workload: str
    outcome: WorkloadOutcome
    reason: str
    score: int | None = None
    metrics: tuple[MetricJudgement, ...] = ()
    n_candidate: int = 0
    n_current: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "reason": self.reason, "score": self.score,
                "n_candidate": self.n_candidate, "n_current": self.n_current,
                "metrics": [m.to_json() for m in self.metrics]}  # fmt: skip


class Judge:
    """Classifies a candidate drafter against the current one per workload and interval (module docstring)."""

    def __init__(
        self, *, tolerance: float = 0.05, min_requests: int = 30, max_extra_errors: float = 0.01,
        ci_level: float = 0.95, n_boot: int = 500,
    ) -> None:  # fmt: skip
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
        if min_requests < 2:
            raise ValueError(f"min_requests must be at least 2, got {min_requests!r}")
        if not 0.0 <= max_extra_errors <= 1.0:
            raise ValueError(f"max_extra_errors must be in [0, 1], got {max_extra_errors!r}")
        if not 0.5 <= ci_level < 1.0:
            raise ValueError(f"ci_level must be in [0.5, 1), got {ci_level!r}")
        self.tolerance = tolerance
        self.min_requests = min_requests
        self.max_extra_errors = max_extra_errors
        self.ci_level = ci_level
        self.n_boot = n_boot
        self._speed = NetLoss(min_requests=min_requests, min_holdout=min_requests, n_boot=n_boot, ci_level=ci_level)

    def judge(self, workload: str, candidate: Side, current: Side) -> WorkloadJudgement:
        """The workload's outcome for one interval (see the module docstring)."""
        errors = self._errors(candidate, current)
        speed = self._speed.measured(candidate.speed, current.speed)
        sizes = {"n_candidate": candidate.n, "n_current": current.n}
        if speed.effect is None or speed.ci is None:
            have = f"{len(candidate.speed.ms)} candidate and {len(current.speed.ms)} current requests timed"
            if errors is not None and errors.outcome == "fail":
                return WorkloadJudgement(workload, "fail", _errors_reason(errors), 0, (errors,), **sizes)
            why = speed.note or f"the judge needs {self.min_requests} a side"
            return WorkloadJudgement(workload, "unjudged", f"too few to judge: {have} ({why})", None,
                                     tuple(m for m in (errors,) if m), **sizes)  # fmt: skip
        decode = MetricJudgement(
            "decode_speed", self._classify(speed.effect, speed.ci), float(speed.detail["speculative_ms_per_token"]),
            float(speed.detail["plain_ms_per_token"]), speed.effect, speed.ci,
        )  # fmt: skip
        judged = [m for m in (decode, errors, self._ttft(candidate, current)) if m is not None]
        shown = [m for m in (self._acceptance(candidate, current),) if m is not None]
        outcomes = [m.outcome for m in judged]
        score = round(100 * outcomes.count("pass") / len(judged))
        failed = [m for m in judged if m.outcome == "fail" and m.metric in CRITICAL]
        # A metric that is not critical holds the workload only when it fails (slower beyond doubt): TTFT
        # swings with prompt caches, which differ between a small pool and a large one.
        holding = [m for m in judged if m.outcome != "pass" and (m.metric in CRITICAL or m.outcome == "fail")]
        outcome: WorkloadOutcome = "fail" if failed else "marginal" if holding else "pass"
        reason = "; ".join(_describe(m) for m in (failed or judged))
        return WorkloadJudgement(workload, outcome, reason, score, (*judged, *shown), **sizes)

    def _classify(self, ratio: float, ci: tuple[float, float]) -> Outcome:
        floor = 1.0 - self.tolerance
        return "fail" if ci[1] < floor else "pass" if ratio >= floor else "marginal"

    def _errors(self, candidate: Side, current: Side) -> MetricJudgement | None:
        if candidate.n < self.min_requests or current.n < self.min_requests:
            return None
        cand, cur = candidate.errors / candidate.n, current.errors / current.n
        if cand <= cur + self.max_extra_errors:
            return MetricJudgement("error_rate", "pass", cand, cur)
        table = [[candidate.errors, candidate.n - candidate.errors], [current.errors, current.n - current.errors]]
        p = float(st.fisher_exact(table, alternative="greater").pvalue)
        return MetricJudgement("error_rate", "fail" if p < 1.0 - self.ci_level else "marginal", cand, cur)

    def _ttft(self, candidate: Side, current: Side) -> MetricJudgement | None:
        a, b = candidate.ttft, current.ttft
        if len(a) < self.min_requests or len(b) < self.min_requests or a.mean() <= 0:
            return None
        one = np.ones(1)
        point = (*weighted_mean_moments([b], one), *weighted_mean_moments([a], one))
        cur = bootstrap_moments(b, self.n_boot, "ttft-current")
        cand = bootstrap_moments(a, self.n_boot, "ttft-candidate")
        ratio, ci = point[0] / point[2], percentile_interval(studentized_ratio_draws(cur, cand, point), self.ci_level)
        return MetricJudgement("ttft", self._classify(ratio, ci), float(a.mean()), float(b.mean()), ratio, ci)

    def _acceptance(self, candidate: Side, current: Side) -> MetricJudgement | None:
        if not len(candidate.acceptance) or not len(current.acceptance):
            return None
        return MetricJudgement("acceptance", None, float(candidate.acceptance.mean()),
                               float(current.acceptance.mean()))  # fmt: skip


def _errors_reason(m: MetricJudgement) -> str:
    return f"error rate {m.candidate:.1%} against {m.current:.1%}"


def _describe(m: MetricJudgement) -> str:
    """``decode_speed fail: 0.81x [0.74, 0.88]`` or ``error_rate pass: 0.0% against 0.0%``."""
    if m.metric == "error_rate":
        return f"{m.metric} {m.outcome}: {_errors_reason(m)}"
    return f"{m.metric} {m.outcome}: {ratio_text(m.ratio, m.ci)}"


def ratio_text(ratio: float | None, ci: Sequence[float] | None) -> str:
    """The candidate's ratio to the current drafter's with its interval: ``0.81x [0.74, 0.88]``."""
    low, high = ci or (np.nan, np.nan)
    return f"{np.nan if ratio is None else ratio:.2f}x [{low:.2f}, {high:.2f}]"


def in_words(judgement: Mapping[str, Any]) -> str:
    """A stored workload judgement (:meth:`WorkloadJudgement.to_json`) in its user's words: the metrics that failed
    it, else those that held it, else its decode speed, each the candidate's over the current drafter's with its
    interval (above 1x faster); the judge's reason where none was measured.

    >>> speed = {"metric": "decode_speed", "outcome": "fail", "candidate": 12.2, "current": 10.0, "ratio": 0.82,
    ...          "ci": [0.75, 0.9]}
    >>> in_words({"outcome": "fail", "reason": "decode_speed fail: 0.82x [0.75, 0.90]", "metrics": [speed]})
    'decode speed 0.82x [0.75, 0.90]'
    >>> errors = {"metric": "error_rate", "outcome": "fail", "candidate": 0.05, "current": 0.0}
    >>> in_words({"outcome": "fail", "metrics": [{**speed, "outcome": "pass", "ratio": 1.1}, errors]})
    'error rate 5.0% against 0.0%'
    >>> in_words({"outcome": "unjudged", "reason": "too few to judge: 3 candidate and 40 current requests timed"})
    'too few to judge: 3 candidate and 40 current requests timed'
    """
    judged = [m for m in judgement.get("metrics", ()) if m.get("outcome") is not None]
    failed = [m for m in judged if m["outcome"] == "fail"]
    holding = [m for m in judged if m["outcome"] != "pass" and m["metric"] in CRITICAL]
    said = failed or holding or [m for m in judged if m["metric"] == "decode_speed"]
    if not said:
        return str(judgement.get("reason", ""))
    return "; ".join(_in_words(m) for m in said)


def _in_words(m: Mapping[str, Any]) -> str:
    if m["metric"] == "error_rate":
        return f"error rate {m['candidate']:.1%} against {m['current']:.1%}"
    return f"{WORDS.get(m['metric'], m['metric'])} {ratio_text(m.get('ratio'), m.get('ci'))}"
