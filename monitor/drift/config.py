"""Drift-run parameters, resolved from :class:`monitor.config.Settings` (one ``drift.*`` row each).

>>> from monitor.config import Settings
>>> s = Settings.from_env({"HOME": "/h", "DRAFTWATCH_DRIFT_WORKLOAD_FLOORS": "chat:acceptance=0.08"}, None)
>>> c = DriftConfig.from_settings(s)
>>> c.floor("chat", "acceptance"), c.floor("code", "acceptance"), c.level
(0.08, 0.05, 0.01)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from monitor.config import Settings


@dataclass(frozen=True, slots=True)
class DriftConfig:
    current_window: timedelta = timedelta(hours=1)
    max_current_window: timedelta = timedelta(hours=8)
    reference_window: timedelta = timedelta(days=1)
    level: float = 0.01
    min_requests: int = 30
    min_holdout: int = 30
    sample_size: int = 2000
    n_boot: int = 500
    ci_level: float = 0.95
    floors: dict[str, float] = field(
        default_factory=lambda: {"acceptance": 0.05, "latency": 0.10, "psi": 0.25, "mix": 0.10}
    )
    workload_floors: dict[str, dict[str, float]] = field(default_factory=dict)
    # Online detector: per-run cap on new requests fed per workload and pair (the newest ones).
    detector_batch: int = 5000

    @classmethod
    def from_settings(cls, settings: Settings) -> DriftConfig:
        per_workload: dict[str, dict[str, float]] = {}
        for workload, key, value in settings.drift_workload_floors:
            per_workload.setdefault(workload, {})[key] = value
        return cls(
            current_window=settings.drift_current_window,
            max_current_window=settings.drift_max_current_window,
            reference_window=settings.drift_reference_window,
            level=settings.drift_fdr_level,
            min_requests=settings.drift_min_requests,
            min_holdout=settings.drift_min_requests,
            sample_size=settings.drift_sample_size,
            floors={
                "acceptance": settings.drift_acceptance_floor,
                "latency": settings.drift_latency_floor,
                "psi": 0.25,
                "mix": 0.10,
            },
            workload_floors=per_workload,
        )

    def floor(self, workload: str | None, key: str) -> float:
        """The floor of ``key`` for ``workload``: its own override, else the default."""
        if workload is not None and key in self.workload_floors.get(workload, {}):
            return self.workload_floors[workload][key]
        return self.floors[key]
