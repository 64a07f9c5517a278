"""The transactional outbox: notifications written in the alert change's own transaction.

Alerts notified in one evaluation are grouped by the values of ``alerts.group_by`` (default: the
workload); each group becomes one notification per receiver, rendered in the receiver's format
and stored with a fresh ``notification_id`` (sent as ``webhook-id``). Nothing is sent here: the
delivery worker (:mod:`monitor.notify.delivery`) reads the outbox, so a crash between the alert
change and the send loses nothing and the alert change never waits for a receiver.

Webhook receivers get *notices*: what the state machine decided to tell (a firing, a repeat, a
resolution; none while silenced, acknowledged or flapping). A receiver that mirrors state
(Alertmanager's API) gets *states* instead: every firing alert on every evaluation, and each
resolution, because Alertmanager resolves an alert that is not posted again before its ``endsAt``
and applies its own silences, grouping and repeats.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.engine import Connection

from monitor.notify.formats import AlertView, group_key, render
from monitor.notify.models import NotificationRow
from monitor.notify.receivers import WebhookReceiver

log = logging.getLogger(__name__)


def new_notification_id() -> str:
    """A unique id in the Standard Webhooks style (``msg_`` + 32 hex digits)."""
    return f"msg_{uuid.uuid4().hex}"


def group(alerts: Sequence[AlertView], group_by: Sequence[str]) -> list[tuple[dict[str, str], list[AlertView]]]:
    """Alerts grouped by the values of ``group_by`` labels, groups and alerts in a stable order.

    >>> from datetime import UTC, datetime
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> v = [AlertView(i, f"f{i}", "r", "info", "firing", {"workload": w}, {}, t, None, None)
    ...      for i, w in enumerate(["code", "chat", "code"])]
    >>> [(g, [a.id for a in members]) for g, members in group(v, ["workload"])]
    [({'workload': 'chat'}, [1]), ({'workload': 'code'}, [0, 2])]
    """
    groups: dict[tuple[tuple[str, str], ...], list[AlertView]] = {}
    for alert in alerts:
        key = tuple((name, alert.labels.get(name, "")) for name in group_by)
        groups.setdefault(key, []).append(alert)
    return [(dict(key), sorted(members, key=lambda a: a.id)) for key, members in sorted(groups.items())]


def write_notifications(
    conn: Connection,
    notices: Sequence[AlertView],
    states: Sequence[AlertView],
    receivers: Sequence[WebhookReceiver],
    group_by: Sequence[str],
    external_url: str,
    now: datetime,
) -> int:
    """Insert the outbox rows on ``conn`` (the caller's transaction): ``notices`` for webhook receivers,
    ``states`` for receivers that mirror state (see the module docstring); returns how many."""
    rows: list[dict[str, Any]] = []
    for receiver in receivers:
        for labels, members in group(states if receiver.mirrors_state else notices, group_by):
            notification_id = new_notification_id()
            rows.append(
                {
                    "notification_id": notification_id,
                    "receiver": receiver.name,
                    "format": receiver.format,
                    "group_key": group_key(labels),
                    "status": "pending",
                    "body": render(receiver, notification_id, labels, members, external_url, now),
                    "alerts": [{"id": a.id, "status": a.status} for a in members],
                    "attempts": 0,
                    "created_at": now,
                    "next_attempt_at": now,
                    "claimed_until": None,
                    "claimed_by": None,
                    "last_status": None,
                    "last_error": None,
                    "delivered_at": None,
                }
            )
    if rows:
        conn.execute(insert(NotificationRow), rows)
        log.info("outbox: %d notification(s) carrying %d alert(s)", len(rows), sum(len(r["alerts"]) for r in rows))
    return len(rows)
