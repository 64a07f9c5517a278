"""Holdout: which requests decode without speculation, as control traffic for the measured speedup.

A fixed share starves a small workload and overpays on a big one: at 5 % a workload of 40
requests an hour yields 2 holdout requests, where the drift run's measured net-loss test needs 30
in its window; one of 10,000 an hour yields 500 it does not need. So each workload has a **target**
count per window (``target`` requests in the last ``window_s`` seconds): below it, requests are
held out at ``max_share`` (or ``share`` if that is higher); at or above it, at the floor ``share``.
A small workload then reaches its target as fast as ``max_share`` allows (and pays at most that),
a big one pays about ``share``.
Every holdout is a seeded random draw either way, so holdout requests stay a random sample of the
workload's traffic; the reason (``target`` or ``share``) says at which rate it was drawn.

>>> clock = iter(range(0, 100_000, 10)).__next__    # a request every 10 s: 360 an hour
>>> holdout = Holdout(HoldoutPolicy(share=0.01, target=30, max_share=0.25), seed=1, clock=clock)
>>> reasons = [holdout.draw("chat") for _ in range(720)]
>>> reasons.count("target") >= 30 and reasons.count("share") < reasons.count("target")
True
>>> HoldoutPolicy(share=0.01, target=30, max_share=1.2)
Traceback (most recent call last):
...
ValueError: holdout max_share must be in [0, 1], got 1.2
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

HoldoutReason = Literal["target", "share"]
HOLDOUT_REASONS: Final = ("target", "share")


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
    """Per workload, draws whether the next request is held out; remembers recent holdouts to count them."""

    def __init__(self, policy: HoldoutPolicy, seed: int = 0, clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self._rng = random.Random(seed)
        self._clock = clock
        self._recent: dict[str, list[float]] = {}

    def draw(self, workload: str) -> HoldoutReason | None:
        """Hold the next request of ``workload`` out? The reason if so, else None."""
        p = self.policy
        now = self._clock()
        recent = [t for t in self._recent.get(workload, []) if t > now - p.window_s]
        reason: HoldoutReason = "target" if len(recent) < p.target else "share"
        share = max(p.max_share, p.share) if reason == "target" else p.share
        held = share > 0 and self._rng.random() < share
        if held:
            recent.append(now)
        self._recent[workload] = recent
        return reason if held else None

    def state(self) -> dict[str, Any]:
        return {"rng": _encode_rng(self._rng.getstate()), "recent": self._recent}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume the random draws and the recent holdouts of :meth:`state` (the policy stays this one's)."""
        self._rng.setstate(_decode_rng(state["rng"]))
        self._recent = {name: [float(t) for t in times] for name, times in state["recent"].items()}


def _encode_rng(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _decode_rng(data: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)
