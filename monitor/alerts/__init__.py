"""Alerts: rules over drift results and health signals, a state machine per fingerprint, silences,
acknowledgement, grouping, and the transactional outbox the webhook worker delivers from.

Entry points: :func:`monitor.alerts.state.evaluate_alerts` (after a drift run),
:func:`monitor.alerts.health.evaluate_health` (scheduler health, recorder spool, dead letters) and
:mod:`monitor.alerts.queries` (list, acknowledge, silences). ``docs/alerts.md`` explains the rules.
"""
