"""Online change detection between scheduled runs: a two-sided Page–Hinkley test.

Each per-request acceptance rate is standardised with the detector's running mean and standard
deviation (Welford), so ``delta`` and ``threshold`` are in units of the workload's own spread and
one setting suits a code workload (rates near 1) and a prose one alike. With z_t the standardised
value, the detector keeps m_t = sum (z_i - delta) and its running minimum (for a rise) and the
mirror image (for a fall); it fires when either gap exceeds ``threshold``.

Error rates (standardised, approximately normal input): the mean number of requests between false
alarms grows like exp(2 · delta · threshold), about 20,000 requests at the defaults (delta 0.1,
threshold 50); a shift of s standard deviations is found after about threshold / (s - delta)
requests, e.g. ~125 requests for a 10-point drop when per-request rates have sd 0.2.

Warm-up: the first ``min_instances`` (100) requests after a start or a reset only estimate the
mean and spread that standardise the rest, and the detector cannot fire; the drift run reports it
as ``insufficient_data`` until then. At 40 speculative requests an hour that is 2.5 hours.

The state is a small dict (:meth:`state`, :meth:`from_state`) that the drift run stores in the
database, so the detector carries on across runs and processes.

>>> import numpy as np
>>> rng = np.random.default_rng(7)
>>> ph = PageHinkley()
>>> ph.update_many(rng.normal(0.7, 0.2, 2000))
False
>>> ph.update_many(rng.normal(0.5, 0.2, 400)), ph.direction
(True, 'down')
>>> PageHinkley.from_state(ph.state()).drift_detected
True
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


class PageHinkley:
    """Two-sided Page–Hinkley on standardised values; ``update(x)``, read-only ``drift_detected``."""

    def __init__(self, *, delta: float = 0.1, threshold: float = 50.0, min_instances: int = 100) -> None:
        self.delta = delta
        self.threshold = threshold
        self.min_instances = min_instances
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.sum_up = 0.0  # m_t for a rise
        self.min_up = 0.0
        self.sum_down = 0.0  # m_t for a fall
        self.min_down = 0.0
        self._detected = False
        self.direction: str | None = None

    @property
    def drift_detected(self) -> bool:
        return self._detected

    @property
    def statistic(self) -> float:
        """The larger of the two Page–Hinkley gaps (compare with ``threshold``)."""
        return max(self.sum_up - self.min_up, self.sum_down - self.min_down)

    def update(self, x: float) -> bool:
        """Add one observation; returns ``drift_detected``. Once fired it stays so until :meth:`reset`."""
        if not math.isfinite(x):
            return self._detected
        self.n += 1
        # Standardise with the statistics *before* this value, so a sudden change is not absorbed.
        sd = math.sqrt(self.m2 / (self.n - 2)) if self.n > 2 else 0.0
        if self.n > self.min_instances and sd > 0 and not self._detected:
            z = (x - self.mean) / sd
            self.sum_up += z - self.delta
            self.min_up = min(self.min_up, self.sum_up)
            self.sum_down += -z - self.delta
            self.min_down = min(self.min_down, self.sum_down)
            if self.sum_up - self.min_up > self.threshold:
                self._detected, self.direction = True, "up"
            elif self.sum_down - self.min_down > self.threshold:
                self._detected, self.direction = True, "down"
        change = x - self.mean
        self.mean += change / self.n
        self.m2 += change * (x - self.mean)
        return self._detected

    def update_many(self, xs: Iterable[float]) -> bool:
        for x in xs:
            self.update(float(x))
        return self._detected

    def reset(self) -> None:
        """Forget everything: after a reported change the detector learns the new level afresh."""
        self.__init__(delta=self.delta, threshold=self.threshold, min_instances=self.min_instances)  # type: ignore[misc]

    def state(self) -> dict[str, Any]:
        return {
            "delta": self.delta,
            "threshold": self.threshold,
            "min_instances": self.min_instances,
            "n": self.n,
            "mean": self.mean,
            "m2": self.m2,
            "sum_up": self.sum_up,
            "min_up": self.min_up,
            "sum_down": self.sum_down,
            "min_down": self.min_down,
            "detected": self._detected,
            "direction": self.direction,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> PageHinkley:
        ph = cls(delta=state["delta"], threshold=state["threshold"], min_instances=state["min_instances"])
        for key in ("n", "mean", "m2", "sum_up", "min_up", "sum_down", "min_down", "direction"):
            setattr(ph, key, state[key])
        ph._detected = bool(state["detected"])
        return ph
