"""Alerts: rules over drift results and health signals, a state machine per fingerprint, silences,
acknowledgement and grouping; what an evaluation notifies goes into :mod:`monitor.notify`'s outbox.

Entry points: :func:`monitor.alerts.evaluate.evaluate_alerts` (after a drift run) and
:mod:`monitor.alerts.queries` (list, acknowledge); the scheduler's health checks
(:mod:`monitor.scheduler.health`) evaluate their signals through the same rules.
``docs/alerts.md`` explains the rules.
"""
