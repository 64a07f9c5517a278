"""The transactional outbox: notifications written in the alert change's own transaction.

Alerts notified in one evaluation are grouped by the values of ``alerts.group_by`` (default: the
workload); each group becomes one notification per receiver, rendered in the receiver's format
and stored with a fresh ``notification_id`` (sent as ``webhook-id``). Nothing is sent here: the
delivery worker (:mod:`monitor.notify.delivery`) reads the outbox, so a crash between the alert
change and the send loses nothing and the alert change never waits for a receiver.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime

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
    alerts: Sequence[AlertView],
    receivers: Sequence[WebhookReceiver],
    group_by: Sequence[str],
    external_url: str,
    now: datetime,
) -> int:
    """Insert the outbox rows for ``alerts`` on ``conn`` (the caller's transaction); returns how many."""
    rows = []
    for labels, members in group(alerts, group_by):
        for receiver in receivers:
            notification_id = new_notification_id()
            rows.append(
                {
                    "notification_id": notification_id,
                    "receiver": receiver.name,
                    "format": receiver.format,
                    "group_key": group_key(labels),
                    "status": "pending",
                    "body": render(receiver.format, receiver.name, notification_id, labels, members, external_url),
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
        log.info("outbox: %d notification(s) for %d alert change(s)", len(rows), len(alerts))
    return len(rows)
