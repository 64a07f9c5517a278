"""The holdout schedule: counts never starve by luck, positions stay a fair sample, and a saved state resumes it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest
from scipy.stats import binom, chisquare

from decoder.holdout import HOLDOUT_REASONS, Holdout, HoldoutPolicy


def positions(holdout: Holdout, workload: str, n: int) -> list[int]:
    """Which of the next ``n`` requests of ``workload`` are held out, by index."""
    return [k for k in range(n) if holdout.draw(workload) is not None]


def fixed_clock(now: float = 0.0) -> Callable[[], float]:
    return lambda: now


@pytest.mark.parametrize("share", [0.05, 0.2, 0.25, 0.3, 1 / 3, 0.5, 0.9, 1.0])
def test_every_run_of_requests_holds_out_the_floor_or_ceiling_of_its_share(share: float) -> None:
    # The old independent draws held out none of the demo's first 25 requests at 20 % (seed 0).
    for seed in range(20):
        held = [0] * 200
        for k in positions(Holdout(HoldoutPolicy(share=share), seed=seed, clock=fixed_clock()), "w", 200):
            held[k] = 1
        for start in range(0, 200, 7):
            for n in range(1, 200 - start + 1):
                count = sum(held[start : start + n])
                assert math.floor(n * share - 1e-9) <= count <= math.ceil(n * share + 1e-9), (seed, start, n)


def test_the_demo_seed_no_longer_starves_at_twenty_percent() -> None:
    holdout = Holdout(HoldoutPolicy(share=0.2), seed=0, clock=fixed_clock())
    assert len(positions(holdout, "extract", 25)) == 5


def test_every_position_is_held_out_with_probability_share_over_seeds() -> None:
    """Over 2,000 seeds each of the first 10 requests is held out at 30 %: a two-sided binomial interval
    per position at 0.01 % each, so a fair schedule fails with probability at most 10 x 0.01 % = 0.1 %."""
    seeds, share, n = 2000, 0.3, 10
    hits = [0] * n
    for seed in range(seeds):
        for k in positions(Holdout(HoldoutPolicy(share=share), seed=seed, clock=fixed_clock()), "w", n):
            hits[k] += 1
    low, high = binom.ppf(0.00005, seeds, share), binom.ppf(0.99995, seeds, share)
    assert all(low <= h <= high for h in hits), hits


def test_the_first_holdout_falls_anywhere_in_its_period_over_seeds() -> None:
    """At 20 % the first holdout is one of the first 5 requests, each equally likely over seeds: a chi-square
    test at 0.1 %, so a fair schedule fails it with probability 0.1 %."""
    seeds = 1000
    first = [0] * 5
    for seed in range(seeds):
        first[positions(Holdout(HoldoutPolicy(share=0.2), seed=seed, clock=fixed_clock()), "w", 5)[0]] += 1
    assert chisquare(first).pvalue > 0.001, first


def test_reaching_the_target_takes_target_over_max_share_requests() -> None:
    policy = HoldoutPolicy(share=0.01, target=30, max_share=0.2, window_s=3600)
    for seed in range(20):
        holdout = Holdout(policy, seed=seed, clock=fixed_clock())
        reasons = [holdout.draw("small") for _ in range(400)]
        reached = [k for k, r in enumerate(reasons) if r is not None][29] + 1  # requests until the 30th holdout
        # floor(u + 0.2 n) = 30 first at n = ceil((30 - u) / 0.2), in (145, 150].
        assert 146 <= reached <= 150, (seed, reached)
        assert set(reasons[:reached]) == {"target", None}
        # Then the floor: 250 requests at 1 % carry the schedule's position on, 2.5 rounded down or up.
        assert reasons[reached:].count("share") in (2, 3) and "target" not in reasons[reached:]


def test_the_schedule_carries_over_when_the_rate_switches() -> None:
    """Below target at 50 %, at it 10 %: the count stays within 1 of the shares summed, request by request."""
    now = [0.0]
    policy = HoldoutPolicy(share=0.1, target=3, max_share=0.5, window_s=10.0)
    for seed in range(20):
        holdout = Holdout(policy, seed=seed, clock=lambda: now[0])
        expected = 0.0
        count = 0
        for k in range(300):
            now[0] = k * 1.0  # 10 requests a window: the target comes and goes
            recent = len([t for t in holdout.state()["recent"].get("w", []) if t > now[0] - policy.window_s])
            expected += 0.5 if recent < policy.target else 0.1
            count += holdout.draw("w") is not None
            assert abs(count - expected) < 1 + 1e-9, (seed, k, count, expected)


def test_workloads_follow_their_own_schedules() -> None:
    policy = HoldoutPolicy(share=0.25)
    alone = Holdout(policy, seed=3, clock=fixed_clock())
    alone.draw("b")  # b's first request draws b's offset first in both runs
    mine = positions(alone, "a", 100)
    busy = Holdout(policy, seed=3, clock=fixed_clock())
    busy.draw("b")
    interleaved = []
    for k in range(100):
        for _ in range(k % 4):  # b's traffic, however much, moves nothing of a's
            busy.draw("b")
        if busy.draw("a") is not None:
            interleaved.append(k)
    assert interleaved == mine
    # Each workload has its own offset: over seeds, the pair of first holdouts spreads over all 16 pairs
    # (chi-square at 0.1 %), rather than every workload holding out on the same turn.
    pairs = [0] * 16
    for seed in range(1600):
        holdout = Holdout(policy, seed=seed, clock=fixed_clock())
        draws = [(holdout.draw("a"), holdout.draw("b")) for _ in range(4)]
        a = next(k for k, (x, _) in enumerate(draws) if x is not None)
        b = next(k for k, (_, y) in enumerate(draws) if y is not None)
        pairs[4 * a + b] += 1
    assert chisquare(pairs).pvalue > 0.001, pairs


def test_state_restore_round_trip_continues_the_same_schedule() -> None:
    now = [0.0]
    policy = HoldoutPolicy(share=0.05, target=4, max_share=0.3, window_s=50.0)
    first = Holdout(policy, seed=7, clock=lambda: now[0])
    for k in range(37):
        now[0] = float(k)
        first.draw("a" if k % 3 else "b")
    saved = json.loads(json.dumps(first.state()))
    second = Holdout(policy, seed=99, clock=lambda: now[0])
    second.restore(saved)
    assert second.state() == first.state()
    for k in range(37, 200):
        now[0] = float(k)
        for workload in ("a", "b", "c"):  # c is new: both draw its offset from the same generator state
            assert first.draw(workload) == second.draw(workload)


def test_a_state_from_independent_draws_keeps_recent_holdouts_and_starts_fresh_schedules() -> None:
    """The previous version saved ``rng`` and ``recent`` alone (controller state files on users' disks)."""
    old = Holdout(HoldoutPolicy(share=0.2), seed=5, clock=fixed_clock(100.0))
    saved = old.state()
    old_format = {"rng": saved["rng"], "recent": {"code": [90.0, 95.0, 99.0], "chat": [10.0]}}
    policy = HoldoutPolicy(share=0.2, target=3, max_share=0.5, window_s=60.0)
    restored = Holdout(policy, seed=0, clock=fixed_clock(100.0))
    restored.restore(json.loads(json.dumps(old_format)))
    assert restored.state()["recent"] == old_format["recent"]
    # code's 3 recent holdouts meet its target: it draws at the floor 20 %, on a fresh schedule.
    code = [restored.draw("code") for _ in range(10)]
    assert code.count("share") == 2 and "target" not in code
    # chat's one fell out of the window: below target, at 50 %.
    chat = [restored.draw("chat") for _ in range(4)]
    assert chat.count("target") == 2
    # The offsets come from the saved generator, so restoring the same old state gives the same schedules.
    again = Holdout(policy, seed=1, clock=fixed_clock(100.0))
    again.restore(old_format)
    assert [again.draw("code") for _ in range(10)] == code


def test_restore_rejects_a_schedule_position_outside_zero_to_one() -> None:
    holdout = Holdout(HoldoutPolicy(share=0.2), seed=1)
    state = holdout.state() | {"schedules": {"code": 1.5}}
    with pytest.raises(ValueError, match=r"holdout schedules must be positions in \[0, 1\), got \{'code': 1.5\}"):
        holdout.restore(state)


def test_no_share_holds_nothing_out_and_reasons_are_the_known_ones() -> None:
    holdout = Holdout(HoldoutPolicy(), seed=0, clock=fixed_clock())
    assert positions(holdout, "w", 1000) == []
    everything = Holdout(HoldoutPolicy(share=1.0, target=2, max_share=1.0), seed=0, clock=fixed_clock())
    reasons = [everything.draw("w") for _ in range(4)]
    assert reasons == ["target", "target", "share", "share"] and set(reasons) <= set(HOLDOUT_REASONS)
