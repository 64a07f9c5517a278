"""Holdout: which requests decode without speculation, as control traffic for the measured speedup.

A fixed share starves a small workload and overpays on a big one: at 5 % a workload of 40
requests an hour yields 2 holdout requests, where the drift run's measured net-loss test needs 30
in its window; one of 10,000 an hour yields 500 it does not need. So each workload has a **target**
count per window (``target`` requests in the last ``window_s`` seconds): below it, requests are
held out at ``max_share`` (or ``share`` if that is higher); at or above it, at the floor ``share``.
A small workload then reaches its target as fast as ``max_share`` allows (and pays at most that),
a big one pays about ``share``. The reason (``target`` or ``share``) says at which rate a holdout
was drawn.

Independent draws per request starve by luck: a generator whose first 25 values are all at least
0.2 holds out none of 25 requests at 20 %. So each workload follows a **systematic schedule**
with a random offset: it draws ``u`` uniform in ``[0, 1)`` from the seeded generator on its first
request, then adds each request's share ``p_k`` to ``u`` and holds out the request that carries
the sum over an integer::

    request k is held out  <=>  floor(u + p_0 + ... + p_k) > floor(u + p_0 + ... + p_(k-1))

Since ``u`` is uniform, every request is held out with probability exactly its share, and any
run of requests holds out the floor or the ceiling of the sum of its shares, whatever the seed:
at 20 % each 5 consecutive requests hold out exactly one, and reaching ``target`` at ``max_share``
takes ``target / max_share`` requests (give or take one holdout's worth). The sum carries over
when the rate switches between ``max_share`` and ``share``, so the count stays within 1 of the
shares summed. The price of the guarantee is regularity: at a constant share whose inverse is a
whole number the holdouts are exactly that many requests apart, so a client that cycles through
a fixed list of prompts of that length (or a multiple of it) sends the holdout the same prompt.

>>> clock = iter(range(0, 100_000, 10)).__next__    # a request every 10 s: 360 an hour
>>> holdout = Holdout(HoldoutPolicy(share=0.01, target=30, max_share=0.25), seed=1, clock=clock)
>>> reasons = [holdout.draw("chat") for _ in range(360)]
>>> reasons[:120].count("target")    # 120 requests at 25 %: 30, whatever the seed
30
>>> reasons[120:].count("share") in (2, 3)    # then 240 at the floor of 1 %: 2.4, rounded down or up
True
>>> HoldoutPolicy(share=0.01, target=30, max_share=1.2)
Traceback (most recent call last):
...
ValueError: holdout max_share must be in [0, 1], got 1.2
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

# The policy draws "target" and "share"; a proxy's router adds "member" (a request that landed on a
# baseline replica of a shared pool) and "route" (a workload routed to plain on an established net loss).
HoldoutReason = Literal["target", "share", "member", "route"]
HOLDOUT_REASONS: Final = ("target", "share", "member", "route")


@dataclass(frozen=True, slots=True)
class HoldoutPolicy:
    """The floor ``share``, the ``target`` per window of ``window_s`` seconds, and the ``max_share`` to reach it."""

    share: float = 0.0
    target: int = 0
    max_share: float = 0.0
    window_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 <= self.share <= 1:
            raise ValueError(f"holdout share must be in [0, 1], got {self.share!r}")
        if isinstance(self.target, bool) or not isinstance(self.target, int) or self.target < 0:
            raise ValueError(f"holdout target must be a non-negative integer, got {self.target!r}")
        if not 0 <= self.max_share <= 1:
            raise ValueError(f"holdout max_share must be in [0, 1], got {self.max_share!r}")
        if not self.window_s > 0:
            raise ValueError(f"holdout window_s must be positive, got {self.window_s!r}")


class Holdout:
    """Per workload, a systematic schedule of holdout requests; remembers recent holdouts to count them."""

    def __init__(self, policy: HoldoutPolicy, seed: int = 0, clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self._rng = random.Random(seed)
        self._clock = clock
        self._recent: dict[str, list[float]] = {}
        # Per workload, the fractional part of u + the shares so far, in [0, 1): the schedule's position.
        self._carry: dict[str, float] = {}

    def draw(self, workload: str) -> HoldoutReason | None:
        """Hold the next request of ``workload`` out? The reason if so, else None."""
        p = self.policy
        now = self._clock()
        recent = [t for t in self._recent.get(workload, []) if t > now - p.window_s]
        reason: HoldoutReason = "target" if len(recent) < p.target else "share"
        share = max(p.max_share, p.share) if reason == "target" else p.share
        carry = self._carry[workload] if workload in self._carry else self._rng.random()
        carry += share
        # carry < 2 here, and carry - 1 is exact for carry in [1, 2]: the position stays in [0, 1).
        held = carry >= 1.0
        if held:
            carry -= 1.0
            recent.append(now)
        self._carry[workload] = carry
        self._recent[workload] = recent
        return reason if held else None

    def state(self) -> dict[str, Any]:
        return {
            "rng": _encode_rng(self._rng.getstate()),
            "recent": {name: list(times) for name, times in self._recent.items()},
            "schedules": dict(self._carry),
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Resume the generator, the recent holdouts and the schedules of :meth:`state` (the policy stays this one's).

        A state from before schedules (independent draws: ``rng`` and ``recent`` only) keeps its recent
        holdouts, which still count towards the target, and starts each workload's schedule afresh
        with an offset drawn from the restored generator.
        """
        self._rng.setstate(_decode_rng(state["rng"]))
        self._recent = {name: [float(t) for t in times] for name, times in state["recent"].items()}
        carries = {name: float(carry) for name, carry in state.get("schedules", {}).items()}
        bad = {name: carry for name, carry in carries.items() if not 0 <= carry < 1}
        if bad:
            raise ValueError(f"holdout schedules must be positions in [0, 1), got {bad!r}")
        self._carry = carries


class BaselineDraw:
    """Which requests of a two-pool deployment go to its plain baseline, and why.

    A workload routed to plain goes there but for a probe share drawn by the policy, which keeps its
    speedup measured so that it can come back; any other workload's request goes there when the
    holdout policy draws it. The proxy's router and the LiteLLM integration both choose so.

    >>> draw = BaselineDraw(HoldoutPolicy(share=0.5))
    >>> sorted(str(draw.draw("chat", routed=False)) for _ in range(4))
    ['None', 'None', 'share', 'share']
    >>> sorted(str(draw.draw("batch", routed=True)) for _ in range(4))
    ['None', 'None', 'route', 'route']
    """

    def __init__(self, policy: HoldoutPolicy, seed: int = 0) -> None:
        self._holdout = Holdout(policy, seed=seed)
        self._probe = Holdout(policy, seed=seed + 1)

    def draw(self, workload: str, routed: bool) -> HoldoutReason | None:
        """Why this request of ``workload`` goes to the baseline, or None: it goes to the speculative pool."""
        if routed:
            return None if self._probe.draw(workload) is not None else "route"
        return self._holdout.draw(workload)


def process_seed(seed: int | None = None) -> int:
    """``seed``, or where None one of this process's own.

    The shares a sidecar draws (holdout, probe, rollout candidate) must not be every replica's: from
    one fixed seed every sidecar of a fleet drew the same positions of its traffic, so that their
    errors added up instead of averaging out, and a restarted sidecar replayed its draws. A test
    passes a seed to draw the same again.
    """
    return secrets.randbits(63) if seed is None else seed


def _encode_rng(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _decode_rng(data: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)
