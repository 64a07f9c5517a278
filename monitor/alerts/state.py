"""The alert state machine, pure: one evaluation step and the notification decision.

States: ``inactive`` → ``pending`` (active once) → ``firing`` (active for ``for_runs`` consecutive
evaluations *and* ``for_duration_s`` since it went pending) → ``resolved`` (clear for
``clear_runs`` consecutive evaluations). A pending alert that clears goes back to ``inactive``
without a word; a resolved one that turns active starts a new episode. ``None`` (insufficient
data) leaves an alert as it is: missing evidence is neither drift nor recovery.

Notifications (:func:`decide`): a firing alert is notified once per episode, unless silenced or
flapping (more than ``flap_max_fires`` firing notifications within ``flap_window``; held back
until the window has passed); it is notified again every ``repeat_interval`` until acknowledged;
a resolved notice goes out only for an episode whose firing was notified.

>>> from datetime import UTC, datetime, timedelta
>>> cfg = StateConfig(2, 2, 0.0, timedelta(hours=4), timedelta(hours=1), 3)
>>> a, t = AlertState(), datetime(2026, 1, 1, tzinfo=UTC)
>>> signal = [True, True, False, True, False, False]
>>> [step(a, v, cfg, t + timedelta(minutes=i)) or a.state for i, v in enumerate(signal)]
['pending', 'firing', 'firing', 'firing', 'firing', 'resolved']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

MAX_FIRE_TIMES = 20


@dataclass(frozen=True, slots=True)
class StateConfig:
    """Thresholds of one rule (global ``alerts.*`` defaults with the rule's overrides applied)."""

    for_runs: int
    clear_runs: int
    for_duration_s: float
    repeat_interval: timedelta
    flap_window: timedelta
    flap_max_fires: int


@dataclass(slots=True)
class AlertState:
    """The mutable part of an alert row."""

    state: str = "inactive"
    episode: int = 0
    active_runs: int = 0
    clear_runs: int = 0
    pending_since: datetime | None = None
    fired_at: datetime | None = None
    resolved_at: datetime | None = None
    notified: bool = False
    last_notified_at: datetime | None = None
    acked_at: datetime | None = None
    acked_by: str | None = None
    ack_comment: str | None = None
    fire_times: list[str] = field(default_factory=list)


def step(alert: AlertState, active: bool | None, cfg: StateConfig, now: datetime) -> str | None:
    """Apply one evaluation; returns the transition (``"pending"``, ``"firing"``, ``"resolved"``,
    ``"inactive"``) or None when the state did not change."""
    if active is None:
        return None
    if active:
        alert.clear_runs = 0
        if alert.state in ("inactive", "resolved"):
            alert.state, alert.episode = "pending", alert.episode + 1
            alert.active_runs, alert.pending_since = 1, now
            alert.fired_at = alert.resolved_at = alert.acked_at = None
            alert.acked_by = alert.ack_comment = None
            alert.notified, alert.last_notified_at = False, None
            return _maybe_fire(alert, cfg, now) or "pending"
        alert.active_runs += 1
        return _maybe_fire(alert, cfg, now) if alert.state == "pending" else None
    alert.active_runs = 0
    if alert.state == "pending":
        alert.state, alert.pending_since = "inactive", None
        return "inactive"
    if alert.state == "firing":
        alert.clear_runs += 1
        if alert.clear_runs >= cfg.clear_runs:
            alert.state, alert.resolved_at = "resolved", now
            return "resolved"
    return None


def _maybe_fire(alert: AlertState, cfg: StateConfig, now: datetime) -> str | None:
    held = (now - alert.pending_since).total_seconds() if alert.pending_since else 0.0
    if alert.active_runs >= cfg.for_runs and held >= cfg.for_duration_s:
        alert.state, alert.fired_at = "firing", now
        return "firing"
    return None


def flapping(alert: AlertState, cfg: StateConfig, now: datetime) -> bool:
    """Whether the alert already used its firing notifications of the flap window."""
    recent = [t for t in alert.fire_times if now - datetime.fromisoformat(t) < cfg.flap_window]
    return len(recent) >= cfg.flap_max_fires


def decide(alert: AlertState, transition: str | None, cfg: StateConfig, now: datetime, silenced: bool) -> str | None:
    """Whether to notify now: ``"firing"``, ``"resolved"`` or None; updates the notification fields."""
    if transition == "resolved":
        if alert.notified:
            alert.notified = False
            return "resolved"
        return None
    if alert.state != "firing" or silenced:
        return None
    if not alert.notified:
        if flapping(alert, cfg, now):
            return None
        alert.notified, alert.last_notified_at = True, now
        alert.fire_times = [*alert.fire_times, now.isoformat()][-MAX_FIRE_TIMES:]
        return "firing"
    due = alert.last_notified_at is None or now - alert.last_notified_at >= cfg.repeat_interval
    if due and alert.acked_at is None:
        alert.last_notified_at = now
        return "firing"
    return None
