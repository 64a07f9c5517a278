"""The real rollout tests' reference: the judge's word per workload against the engine's own ratio of the same run.

tests/api/test_embedded_rollout.py (the embedded decoder's records), tests/proxy/test_rollout_llama_server.py
(llama.cpp's timings) and tests/demo/test_demo.py (the demo's stored records) each measure the candidate's true
decode speed over the current side's (current ms per token over the candidate's) on the very requests the judge
read, never what the machine was expected to do, and check the judge against it here (:func:`check_judge`): its
decode speed ratio must agree with the measured one; a workload the candidate ran clearly below the judge's floor
(``1 - rollout.tolerance``) must have failed, one clearly above it must have passed, and in the tie zone between,
either word (or a step held on) is the judge's. The bands follow the tolerance the test configures
(:meth:`Bands.of`), so that a changed setting moves them with the floor.

Once the rollout has moved, :func:`expected_sides` says where each workload's requests must go, from the judge's
words so checked and the rollout's status, and checks the stored rollout's ``workloads`` say the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import pytest
from scipy.stats import nbinom

from monitor.store.rollouts import Rollout, RolloutEvent

Call = Literal["fail", "pass"]
Side = Literal["candidate", "current"]

# How close the judge's decode speed ratio must come to the measured one: the judge stratifies by load and context
# length and reads the interval's sample, the tests' truth is the plain mean of each side's requests.
AGREEMENT: Final = 0.15
# A fail needs the interval's top below the floor, and at 10 requests a side the top reached 1.4x the estimate
# (the llama-server and embedded runs): a truth below floor / 1.5 fails.
FAIL_MARGIN: Final = 1.5
# A pass needs the estimate at the floor or above: a truth at floor / (1 - AGREEMENT) passes even with an estimate
# as far below it as the agreement allows. Neither margin is a computed error rate; both are the spreads measured
# on these runs, with the judge's own interval (95 %) inside them.
PASS_MARGIN: Final = 1 / (1 - AGREEMENT)


@dataclass(frozen=True)
class Bands:
    """The measured ratio below which the judge must fail a workload, and from which it must pass it."""

    floor: float
    clear_fail: float
    clear_pass: float

    @classmethod
    def of(cls, tolerance: float) -> Bands:
        """The bands around the judge's floor, ``1 - tolerance``, as factors of it.

        >>> bands = Bands.of(0.25)
        >>> bands.floor, bands.clear_fail, round(bands.clear_pass, 3)
        (0.75, 0.5, 0.882)
        """
        floor = 1.0 - tolerance
        return cls(floor, floor / FAIL_MARGIN, floor * PASS_MARGIN)

    def call(self, truth: float) -> Call | None:
        """The measured ratio's call: ``fail``, ``pass``, or None in the tie zone."""
        return "fail" if truth < self.clear_fail else "pass" if truth >= self.clear_pass else None


@dataclass(frozen=True)
class Word:
    """The judge's last word on a workload: its outcome, decode speed metric and the interval it read."""

    outcome: str
    speed: Mapping[str, Any]  # the ``decode_speed`` metric: ratio, ci, each side's ms per token
    interval: tuple[str, str]  # ISO times: the requests the judge read
    judgement: Mapping[str, Any]  # the workload's whole judgement, as stored

    @property
    def ratio(self) -> float:
        return float(self.speed["ratio"])


def judged_words(events: Iterable[RolloutEvent], latest: Mapping[str, Any]) -> dict[str, Word]:
    """Per workload, the judge's last word that judged it (not ``unjudged``): over ``events``, oldest first, then
    ``latest``, the rollout's newest judgement (``Rollout.judgement``: its interval and workloads)."""
    words: dict[str, Word] = {}
    for judgement in [*(e.judgement for e in events), latest]:
        for workload, word in judgement.get("workloads", {}).items():
            if word["outcome"] == "unjudged":
                continue
            speed = next((m for m in word["metrics"] if m["metric"] == "decode_speed"), None)
            assert speed is not None, (workload, word)  # judged: each side had its decode times
            start, end = judgement["interval"]
            words[workload] = Word(word["outcome"], speed, (start, end), word)
    return words


def truth_of(ms_per_token: Mapping[str, float], what: str) -> float:
    """The candidate's true speed over the current side's: the current side's mean ms per token over its."""
    missing = [s for s in ("candidate", "current") if not ms_per_token.get(s)]
    assert not missing, f"{what}: no request of the {' or '.join(missing)} side with a decode time ({ms_per_token})"
    return ms_per_token["current"] / ms_per_token["candidate"]


def check_judge(
    truths: Mapping[str, float], words: Mapping[str, Word], bands: Bands, *, unjudged_ok: bool = False,
    context: object = None,
) -> dict[str, Call | None]:  # fmt: skip
    """Each workload of ``truths`` (its measured ratio) against the judge's word on it.

    The judge's decode speed ratio must agree with the measured one within :data:`AGREEMENT`; a workload clearly
    below the floor must have failed, one clearly above it must have passed. ``unjudged_ok``: a workload the judge
    never judged is allowed, in the tie zone only (a step held for want of requests), else it must have been.
    Returns the measured call per workload: ``fail``, ``pass`` or None in the tie zone, where the judge's word stands.
    """
    calls: dict[str, Call | None] = {}
    for workload, truth in truths.items():
        calls[workload] = bands.call(truth)
        word = words.get(workload)
        report = (workload, round(truth, 3), bands, word and word.judgement, context)
        if word is None:
            assert unjudged_ok and calls[workload] is None, report
            print(f"  {workload}: measured {truth:.2f}x, never judged")
            continue
        low, high = word.speed["ci"]
        print(f"  {workload}: measured {truth:.2f}x, the judge's {word.ratio:.2f}x [{low:.2f}, {high:.2f}]: "
              f"{word.outcome}")  # fmt: skip
        assert word.ratio == pytest.approx(truth, rel=AGREEMENT), report
        if calls[workload] is not None:
            assert word.outcome == calls[workload], report
    return calls


def decided(rollout: Rollout, step: int = 0) -> bool:
    """Has the judge moved the rollout at all since ``step`` began: ended it, stepped it on, or kept a workload?"""
    return rollout.status != "running" or rollout.step != step or bool(rollout.workloads)


def expected_sides(rollout: Rollout, words: Mapping[str, Word], workloads: Iterable[str]) -> dict[str, Side | None]:
    """Where each of ``workloads``' requests must go now: from the judge's ``words`` and the rollout's status.

    Ended (rolled back or aborted), every one to the current side; per workload, a failed one to the current side
    (kept), once promoted a passed one to the candidate and any other to the current side; a whole promotion
    gives the candidate all. None: still split by the running step. The stored ``workloads`` must say the same.
    """
    sides: dict[str, Side | None] = {}
    for workload in workloads:
        word = words.get(workload)
        outcome = word.outcome if word is not None else None
        stored = rollout.workloads.get(workload)
        report = (workload, outcome, rollout)
        if rollout.status not in ("running", "promoted"):
            sides[workload] = "current"
        elif not rollout.per_workload:
            assert stored is None, report
            sides[workload] = "candidate" if rollout.status == "promoted" else None
        elif outcome == "fail":
            assert stored == "current", report
            sides[workload] = "current"
        elif rollout.status == "promoted":
            sides[workload] = "candidate" if outcome == "pass" else "current"
            assert stored == ("candidate" if outcome == "pass" else None), report
        else:
            assert stored is None, report
            sides[workload] = None
    return sides


def routes_as(seen: Rollout | None, stored: Rollout) -> bool:
    """Does a sidecar that read ``seen`` (its router's or decoder's last read) serve as ``stored`` says: nothing once
    it ended, else the same step, status and workloads?"""
    if not stored.active:
        return seen is None
    return seen is not None and (seen.id, seen.status, seen.step, dict(seen.workloads)) == (
        stored.id, stored.status, stored.step, dict(stored.workloads))  # fmt: skip


def fill_bound(need: int, share: float, p_error: float) -> int:
    """Requests of a workload after which a side still short of ``need`` is an error, with probability ``p_error``.

    Each request goes to the candidate with probability ``share`` (the draws are seeded per process): the requests
    a side with probability p needs are ``need`` plus a negative binomial's failures; past its ``1 - p_error / 2``
    quantile at the rarer side's p, either side is short with probability at most ``p_error`` (a union bound over
    both). 8 more for what counts on neither side (a holdout's few plain requests).
    """
    p = min(share, 1.0 - share) if 0.0 < share < 1.0 else 1.0
    return need + int(nbinom.ppf(1.0 - p_error / 2, need, p)) + 8
