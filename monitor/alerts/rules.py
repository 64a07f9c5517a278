"""Alert rules: which drift decisions and health signals become alerts, with what severity.

A rule maps *signals* to alerts. A drift signal is one stored drift result (its ``test``, labels
``workload``, ``pair``, ``metric``, its decision and effect); a health signal is one check of the
scheduler, the recorder's spool or the webhook dead letters. Signals that share a rule and labels
share one alert (its fingerprint); it is active when any of them is, clear when all known ones are,
and unknown (the state machine holds) when every signal is ``insufficient_data``.

Rules come from ``alerts.rules`` (TOML ``[[alerts.rules]]`` tables or a JSON list in
``DRAFTWATCH_ALERTS_RULES``): a table whose ``name`` is a default rule overrides its fields
(``enabled = false`` switches it off); any other name adds a rule.

>>> rules = parse_rules([{"name": "net_loss", "severity": "warning"}, {"name": "latency_regression", "enabled": False}])
>>> [(r.name, r.severity) for r in rules if r.enabled]  # doctest: +NORMALIZE_WHITESPACE
[('acceptance_drop', 'warning'), ('net_loss', 'warning'), ('traffic_mix_shift', 'info'),
 ('recorder_spooling', 'warning'), ('scheduler', 'critical'), ('webhook_dead_letters', 'warning'),
 ('scrape_target_down', 'warning'), ('routing_changed', 'warning'), ('rollout_advanced', 'info'),
 ('rollout_rolled_back', 'critical'), ('rollout_promoted', 'info')]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final

from monitor.settings.parsers import parse_tables

SEVERITIES: Final = ("info", "warning", "critical")
SOURCES: Final = ("drift", "health")
_FIELDS: Final = {
    "name", "source", "tests", "metrics", "severity", "effect_below", "effect_above",
    "for_runs", "for_duration_s", "clear_runs", "summary", "enabled",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Rule:
    """One alert rule. ``None`` counters take the global ``alerts.*`` defaults."""

    name: str
    source: str
    tests: tuple[str, ...]
    severity: str = "warning"
    metrics: tuple[str, ...] = ()
    # Direction: a drift result counts only when its effect is below / above these (None: any effect).
    effect_below: float | None = None
    effect_above: float | None = None
    for_runs: int | None = None
    for_duration_s: float | None = None
    clear_runs: int | None = None
    summary: str = ""
    enabled: bool = True

    def applies(self, source: str, test: str, metric: str | None) -> bool:
        return (
            self.enabled
            and source == self.source
            and test in self.tests
            and (not self.metrics or (metric or "") in self.metrics)
        )

    def verdict(self, decision: str, effect: float | None) -> bool | None:
        """True (active), False (clear) or None (unknown: insufficient data) for one signal."""
        if decision == "insufficient_data":
            return None
        if decision != "drift":
            return False
        if self.effect_below is not None and not (effect is not None and effect < self.effect_below):
            return False
        return not (self.effect_above is not None and not (effect is not None and effect > self.effect_above))


DEFAULT_RULES: Final[tuple[Rule, ...]] = (
    Rule(
        "acceptance_drop", "drift", ("acceptance", "acceptance_by_length", "page_hinkley"), "warning", effect_below=0.0,
        summary="acceptance rate dropped",
    ),
    Rule(
        "latency_regression", "drift", ("latency",), "warning", effect_above=1.0,
        summary="latency regressed (p95 ratio above its floor)",
    ),
    Rule("net_loss", "drift", ("net_loss",), "critical", summary="speculation is slower than plain decoding"),
    Rule(
        "traffic_mix_shift", "drift", ("traffic_mix", "prompt_length"), "info",
        summary="the workload mix or prompt lengths shifted",
    ),
    Rule(
        "recorder_spooling", "health", ("recorder_spool",), "warning",
        summary="the recorder is spooling: the database is not taking writes",
    ),
    Rule(
        "scheduler", "health", ("job_failures", "drift_stale"), "critical", for_runs=1, clear_runs=1,
        summary="scheduled jobs fail repeatedly or drift runs stopped",
    ),
    Rule(
        "webhook_dead_letters", "health", ("dead_letters",), "warning", for_runs=1, clear_runs=1,
        summary="webhook notifications were given up on (dead letters)",
    ),
    Rule(
        "scrape_target_down", "health", ("scrape_target",), "warning", for_runs=1, clear_runs=1,
        summary="a scrape target has failed its last scrapes (down or not an engine's metrics)",
    ),
    Rule(
        "routing_changed", "health", ("routing",), "warning", for_runs=1, clear_runs=1,
        summary="a workload was routed to the plain baseline, whole or from the load its note names (route above N in "
        "flight): speculation lost there (it resolves on the way back)",
    ),
    # A drafter rollout's transitions (monitor/proxy/rollout.py), one episode per rollout_events row:
    # each step a rollout advances to, each rollback (a workload kept on the current drafter included), each promotion.
    Rule(
        "rollout_advanced", "health", ("rollout_step",), "info", for_runs=1, clear_runs=1,
        summary="a drafter rollout advanced a step: every judged workload passed",
    ),
    Rule(
        "rollout_rolled_back", "health", ("rollout_rollback",), "critical", for_runs=1, clear_runs=1,
        summary="a drafter rollout was rolled back: the candidate drafter lost to the current one",
    ),
    Rule(
        "rollout_promoted", "health", ("rollout_promotion",), "info", for_runs=1, clear_runs=1,
        summary="a drafter rollout promoted its candidate drafter",
    ),
)  # fmt: skip


def _tuple_of_str(value: Any, key: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items or not all(isinstance(i, str) and i for i in items):
        raise ValueError(f"{key} must be a non-empty list of strings")
    return tuple(items)


def _rule_fields(entry: dict[str, Any], number: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if key not in _FIELDS:
            raise ValueError(f"rule {number}: unknown key {key!r}")
        if key in ("tests", "metrics"):
            out[key] = _tuple_of_str(value, f"rule {number}: {key}") if value else ()
        elif key in ("effect_below", "effect_above", "for_duration_s"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"rule {number}: {key} must be a number")
            out[key] = float(value)
        elif key in ("for_runs", "clear_runs"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"rule {number}: {key} must be an integer >= 1")
            out[key] = value
        elif key == "enabled":
            if not isinstance(value, bool):
                raise ValueError(f"rule {number}: enabled must be true or false")
            out[key] = value
        elif not isinstance(value, str) or not value:
            raise ValueError(f"rule {number}: {key} must be a non-empty string")
        else:
            out[key] = value
    if out.get("severity", "warning") not in SEVERITIES:
        raise ValueError(f"rule {number}: severity must be one of {', '.join(SEVERITIES)}")
    if out.get("source", "drift") not in SOURCES:
        raise ValueError(f"rule {number}: source must be one of {', '.join(SOURCES)}")
    return out


def parse_rules(raw: Any) -> tuple[Rule, ...]:
    """The default rules with the configured overrides and additions applied."""
    raw = parse_tables(raw, "rule tables")
    rules = {r.name: r for r in DEFAULT_RULES}
    for number, entry in enumerate(raw, start=1):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise ValueError(f"rule {number}: expected a table with a name")
        fields = _rule_fields(entry, number)
        if entry["name"] in rules:
            rules[entry["name"]] = dataclasses.replace(rules[entry["name"]], **fields)
        elif "tests" not in fields:
            raise ValueError(f"rule {number}: a new rule needs tests (and source, default drift)")
        else:
            rules[entry["name"]] = Rule(**{"source": "drift", **fields})
    return tuple(rules.values())
