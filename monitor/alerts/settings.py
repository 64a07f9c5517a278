"""The alerts' settings (the rules, the thresholds every rule starts from) and what an evaluation is given."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from monitor.alerts.rules import DEFAULT_RULES, Rule, parse_rules
from monitor.alerts.state import StateConfig
from monitor.notify.receivers import WebhookReceiver
from monitor.settings.fields import setting
from monitor.settings.parsers import parse_duration, parse_int, parse_names


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertSettings:
    rules: tuple[Rule, ...] = setting(
        "alerts.rules",
        parse_rules,
        DEFAULT_RULES,
        "[[alerts.rules]] tables (JSON list in the environment) overriding or adding to the default rules "
        "(see docs/alerts.md)",
        renamed_from=("DRAFTWATCH_ALERT_RULES",),
    )
    for_runs: int = setting(
        "alerts.for_runs",
        parse_int(1),
        2,
        "consecutive active evaluations before a pending alert fires",
    )
    clear_runs: int = setting(
        "alerts.clear_runs",
        parse_int(1),
        2,
        "consecutive clear evaluations before a firing alert resolves",
    )
    repeat_interval: timedelta = setting(
        "alerts.repeat_interval",
        parse_duration,
        timedelta(hours=4),
        "how often a firing, unacknowledged alert is notified again",
    )
    group_by: tuple[str, ...] = setting(
        "alerts.group_by",
        parse_names,
        ("workload",),
        "labels whose values group alerts into one notification, comma-separated",
    )
    flap_window: timedelta = setting(
        "alerts.flap_window",
        parse_duration,
        timedelta(hours=1),
        "window in which repeated firing counts as flapping",
    )
    flap_max_fires: int = setting(
        "alerts.flap_max_fires",
        parse_int(1),
        3,
        "firing notifications per alert within flap_window; more are held back",
    )

    def state_config(self, rule: Rule) -> StateConfig:
        """The thresholds of ``rule``: its own overrides, else these defaults."""
        return StateConfig(
            for_runs=rule.for_runs or self.for_runs,
            clear_runs=rule.clear_runs or self.clear_runs,
            for_duration_s=rule.for_duration_s if rule.for_duration_s is not None else 0.0,
            repeat_interval=self.repeat_interval,
            flap_window=self.flap_window,
            flap_max_fires=self.flap_max_fires,
        )


@dataclass(frozen=True, slots=True)
class AlertConfig:
    """What an evaluation needs: the ``alerts.*`` section, where notifications go, and the URL they link to."""

    alerts: AlertSettings
    receivers: tuple[WebhookReceiver, ...] = ()
    external_url: str = "http://127.0.0.1:8321"
