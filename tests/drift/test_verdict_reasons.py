"""The verdict's reason names the side that is missing and the step that would fill it, never one already taken.

Issue 36: with a baseline configured and answering, an n-gram deployment's workload was told "not
measured: ... add it as a baseline". The drift run now stores what each side held (``sides``) and
the reason is read off it.
"""

from __future__ import annotations

from typing import Any

import pytest

from monitor.drift.result import DriftResult, insufficient
from monitor.drift.verdict import HOW_TO_MEASURE, verdict_of


def result(**sides: int) -> DriftResult:
    held = {"speculative": 40, "speculative_timed": 40, "min_speculative": 30, "holdout": 40, "holdout_timed": 40,
            "plain": 80, "plain_timed": 80, "min_plain": 30, **sides}  # fmt: skip
    r = insufficient("net_loss", "speedup", held["plain_timed"], held["speculative_timed"], 30)
    return r.replace(workload="qa", detail={"sides": held})


@pytest.mark.parametrize(
    ("sides", "verdict", "says", "never"),
    [
        # The qa case before the fix: every speculative-pool answer stored as plain.
        (
            {"speculative": 0, "speculative_timed": 0},
            "not_measured",
            "no speculative requests of this workload",
            "baseline-upstream",
        ),
        (
            {"speculative_timed": 0},
            "not_measured",
            "none with a decode time; a non-streamed answer",
            "baseline-upstream",
        ),
        # A baseline answers, but this workload's share of it is small: the holdout share is the step.
        (
            {"holdout": 4, "holdout_timed": 4, "plain": 4, "plain_timed": 4},
            "inconclusive",
            "too few plain requests: 4",
            "baseline-upstream",
        ),
        (
            {"speculative": 12, "speculative_timed": 12},
            "inconclusive",
            "too few speculative requests: 12 speculative",
            "holdout share",
        ),
        ({"holdout": 0, "holdout_timed": 0, "plain": 0, "plain_timed": 0}, "not_measured", "baseline-upstream", "@"),
        (
            {"holdout": 0, "holdout_timed": 0, "plain": 9, "plain_timed": 0},
            "not_measured",
            "9 plain requests of the target, none with a decode time",
            "baseline-upstream",
        ),
    ],
)
def test_the_reason_names_the_missing_side_and_the_next_step(
    sides: dict[str, Any], verdict: str, says: str, never: str
) -> None:
    v = verdict_of(result(**sides))
    assert (v.verdict, v.workload) == (verdict, "qa")
    assert says in v.reason and never not in v.reason, v.reason


def test_no_plain_request_at_all_is_told_how_to_measure() -> None:
    v = verdict_of(result(holdout=0, holdout_timed=0, plain=0, plain_timed=0))
    assert v.reason == HOW_TO_MEASURE


def test_strata_that_do_not_overlap_say_so_and_what_would_give_a_comparison() -> None:
    why = "strata do not overlap: 3 of 40 speculative and 2 of 40 plain requests share a load level and context length"
    r = insufficient("net_loss", "speedup", 40, 40, 30).replace(detail={"inconclusive": why}, workload="qa")
    v = verdict_of(r)
    assert v.verdict == "inconclusive" and v.reason.startswith(why) and "baseline_policy = member" in v.reason
