"""Notification bodies per receiver format: ``alertmanager`` (webhook payload version "4"),
``alertmanager-api`` (the alert list Alertmanager's ``POST /api/v2/alerts`` takes), ``slack``
(incoming-webhook ``text`` plus ``blocks``) and ``json`` (draftwatch's own).

A body is rendered once, when the notification is written to the outbox, so every retry sends the
same bytes under the same ``webhook-id``.

>>> from datetime import UTC, datetime
>>> from monitor.notify.receivers import WebhookReceiver
>>> a = AlertView(7, "3f2a9c0d1e4b5a69", "acceptance_drop", "warning", "firing",
...               {"alertname": "acceptance_drop", "severity": "warning", "workload": "code"},
...               {"summary": "acceptance rate dropped (code)"}, datetime(2026, 1, 1, tzinfo=UTC), None, -0.12)
>>> t, url = datetime(2026, 1, 1, 0, 5, tzinfo=UTC), "http://localhost:8321"
>>> hook = WebhookReceiver("r", "http://hooks.internal/x", "alertmanager")
>>> body = json.loads(render(hook, "msg_1", {"workload": "code"}, [a], url, t))
>>> body["version"], body["status"], body["groupKey"], body["alerts"][0]["endsAt"]
('4', 'firing', '{}:{workload="code"}', '0001-01-01T00:00:00Z')
>>> am = WebhookReceiver("am", "http://am.internal:9093", "alertmanager-api")
>>> (posted,) = json.loads(render(am, "msg_2", {"workload": "code"}, [a], url, t))
>>> posted["labels"]["source"], posted["endsAt"]
('draftwatch', '2026-01-01T00:25:00.000000Z')
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from monitor.notify.receivers import ALERTMANAGER_API, WebhookReceiver

# Alertmanager's zero time: "no end yet" for a firing alert.
ZERO_TIME: Final = "0001-01-01T00:00:00Z"
JSON_VERSION: Final = "draftwatch.alerts/1"
# Added to every alert posted to Alertmanager, so its routes and silences can tell draftwatch's apart.
SOURCE_LABEL: Final = "source"


@dataclass(frozen=True, slots=True)
class AlertView:
    """What a notification says about one alert."""

    id: int
    fingerprint: str
    rule: str
    severity: str
    status: str  # "firing" or "resolved"
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: datetime
    ends_at: datetime | None
    value: float | None


def _rfc3339(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if value is not None else ZERO_TIME


def _common(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = maps[0]
    return {k: v for k, v in sorted(first.items()) if all(m.get(k) == v for m in maps[1:])}


def group_key(group_labels: Mapping[str, str]) -> str:
    """Alertmanager-style group key: ``{}:{label="value",...}``."""
    return "{}:{" + ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(group_labels.items())) + "}"


def _link(url: str, alert_id: int) -> str:
    return f"{url}/v1/alerts?id={alert_id}"


def _status(alerts: Sequence[AlertView]) -> str:
    return "firing" if any(a.status == "firing" for a in alerts) else "resolved"


def alertmanager(receiver: str, group_labels: Mapping[str, str], alerts: Sequence[AlertView], url: str) -> Any:
    return {
        "version": "4",
        "groupKey": group_key(group_labels),
        "truncatedAlerts": 0,
        "status": _status(alerts),
        "receiver": receiver,
        "groupLabels": dict(sorted(group_labels.items())),
        "commonLabels": _common([a.labels for a in alerts]),
        "commonAnnotations": _common([a.annotations for a in alerts]),
        "externalURL": url,
        "alerts": [
            {
                "status": a.status,
                "labels": dict(sorted(a.labels.items())),
                "annotations": dict(sorted(a.annotations.items())),
                "startsAt": _rfc3339(a.starts_at),
                "endsAt": _rfc3339(a.ends_at) if a.status == "resolved" else ZERO_TIME,
                "generatorURL": _link(url, a.id),
                "fingerprint": a.fingerprint,
            }
            for a in alerts
        ],
    }


def alertmanager_api(alerts: Sequence[AlertView], url: str, expires_at: datetime) -> Any:
    """Alertmanager's ``postableAlerts`` (api/v2/openapi.yaml): ``labels``, ``annotations``, ``startsAt``,
    ``endsAt``, ``generatorURL``. A firing alert ends at ``expires_at`` unless posted again before; a
    resolved one at the time draftwatch resolved it. Alertmanager identifies an alert by its labels."""
    return [
        {
            "labels": dict(sorted({**a.labels, SOURCE_LABEL: "draftwatch"}.items())),
            "annotations": dict(sorted(a.annotations.items())),
            "startsAt": _rfc3339(a.starts_at),
            "endsAt": _rfc3339(a.ends_at if a.status == "resolved" else expires_at),
            "generatorURL": _link(url, a.id),
        }
        for a in alerts
    ]


def _line(a: AlertView) -> str:
    where = ", ".join(f"{k}={a.labels[k]}" for k in ("workload", "pair", "metric") if a.labels.get(k))
    mark = ":red_circle:" if a.status == "firing" else ":large_green_circle:"
    summary = a.annotations.get("summary", a.rule)
    return f"{mark} *{a.status.upper()}* [{a.severity}] {a.rule}: {summary}" + (f" ({where})" if where else "")


def slack(group_labels: Mapping[str, str], alerts: Sequence[AlertView]) -> Any:
    firing = sum(a.status == "firing" for a in alerts)
    group = ", ".join(f"{k}={v}" for k, v in sorted(group_labels.items())) or "all"
    title = f"draftwatch: {firing} firing, {len(alerts) - firing} resolved ({group})"
    lines = [_line(a) for a in alerts]
    return {
        "text": "\n".join([title, *lines]),
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:3000]}},
        ],
    }


def own_json(
    receiver: str, notification_id: str, group_labels: Mapping[str, str], alerts: Sequence[AlertView], url: str
) -> Any:
    return {
        "version": JSON_VERSION,
        "notification_id": notification_id,
        "receiver": receiver,
        "status": _status(alerts),
        "group": dict(sorted(group_labels.items())),
        "external_url": url,
        "alerts": [
            {
                "id": a.id,
                "fingerprint": a.fingerprint,
                "rule": a.rule,
                "severity": a.severity,
                "status": a.status,
                "labels": dict(sorted(a.labels.items())),
                "annotations": dict(sorted(a.annotations.items())),
                "starts_at": a.starts_at.isoformat(),
                "ends_at": a.ends_at.isoformat() if a.ends_at and a.status == "resolved" else None,
                "value": a.value,
            }
            for a in alerts
        ],
    }


def render(
    receiver: WebhookReceiver,
    notification_id: str,
    group_labels: Mapping[str, str],
    alerts: Sequence[AlertView],
    external_url: str,
    now: datetime,
) -> str:
    """The body text in ``receiver``'s format (compact JSON, UTF-8 safe); ``now`` is the evaluation's time."""
    fmt = receiver.format
    if fmt == "alertmanager":
        doc = alertmanager(receiver.name, group_labels, alerts, external_url)
    elif fmt == ALERTMANAGER_API:
        doc = alertmanager_api(alerts, external_url, now + receiver.expires_after)
    elif fmt == "slack":
        doc = slack(group_labels, alerts)
    elif fmt == "json":
        doc = own_json(receiver.name, notification_id, group_labels, alerts, external_url)
    else:
        raise ValueError(f"unknown webhook format {fmt!r}")
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
