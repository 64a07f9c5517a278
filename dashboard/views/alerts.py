"""Alerts: firing, pending and resolved alerts, acknowledgement and silences (admins), webhook deliveries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import streamlit as st

from dashboard import auth, components, data
from dashboard.components import Filters
from monitor.alerts.queries import AlertItem, acknowledge
from monitor.alerts.silences import create_silence, expire_silence

st.title("Alerts")
STATE_LABEL = {"firing": "🔴 firing", "pending": "🟠 pending", "resolved": "🟢 resolved"}
DURATIONS = {"1 hour": timedelta(hours=1), "4 hours": timedelta(hours=4), "1 day": timedelta(days=1),
             "1 week": timedelta(weeks=1)}  # fmt: skip


def _when(ts: datetime | None) -> str:
    return "—" if ts is None else f"{ts:%Y-%m-%d %H:%M} UTC"


def alert_rows(alerts: list[AlertItem]) -> list[dict[str, Any]]:
    return [
        {
            "State": STATE_LABEL.get(a.state, a.state),
            "Rule": a.rule,
            "Severity": a.severity,
            "Labels": ", ".join(f"{k}={v}" for k, v in sorted(a.labels.items()) if k != "alertname"),
            "Summary": a.summary,
            "Since": _when(
                a.fired_at if a.state == "firing" else a.pending_since if a.state == "pending" else a.resolved_at
            ),
            "Acknowledged": f"{a.acked_by} ({_when(a.acked_at)}): {a.ack_comment or ''}" if a.acked_at else "—",
        }
        for a in alerts
    ]


def _ack_form(f: Filters, alerts: list[AlertItem]) -> None:
    open_alerts = [a for a in alerts if a.state in ("firing", "pending") and a.acked_at is None]
    if not open_alerts:
        return
    with st.form("ack_form", clear_on_submit=True):
        st.markdown("**Acknowledge** (stops repeat notifications for this episode)")
        labels = {a.id: f"{a.rule} {' '.join(f'{k}={v}' for k, v in sorted(a.labels.items()))}" for a in open_alerts}
        chosen = st.selectbox("Alert", list(labels), format_func=labels.__getitem__, key="dw_ack_alert")
        who = st.text_input("Your name", key="dw_ack_by")
        comment = st.text_input("Comment", key="dw_ack_comment")
        if st.form_submit_button("Acknowledge", key="dw_ack_submit"):
            if chosen is None or not who.strip():
                st.error("Choose an alert and give your name.")
            else:
                done = acknowledge(data.engine(f.url), int(chosen), who.strip(), comment.strip(), datetime.now(UTC))
                data.clear()
                if done is not None and done.acknowledged:
                    st.success("Acknowledged.")
                else:
                    st.warning("That alert changed meanwhile (resolved or gone).")


def _silences(f: Filters) -> None:
    st.subheader("Silences")
    now = datetime.now(UTC)
    active = data.silences(f.url, now.replace(second=0, microsecond=0))
    if active:
        st.dataframe(
            [
                {
                    "Id": s.id,
                    "Matchers": ", ".join(
                        f"{m.name}{'=' if m.equal else '!='}{'~' if m.regex else ''}{m.value}" for m in s.matchers
                    ),
                    "From": _when(s.starts_at),
                    "Until": _when(s.ends_at),
                    "By": s.created_by,
                    "Comment": s.comment,
                }
                for s in active
            ],
            hide_index=True,
            key="silences_table",
            placeholder=components.MISSING,
        )
    else:
        st.caption("No active silences.")
    if not auth.is_admin():
        st.caption("Acknowledging alerts and adding silences needs an admin login.")
        return
    with st.form("silence_form", clear_on_submit=True):
        st.markdown("**New silence**: matching alerts are not notified while it lasts")
        a, b, c = st.columns(3)
        workload = a.selectbox("Workload", ["(any)", *f.available], key="dw_sil_workload")
        rule = b.text_input("Rule (alertname)", placeholder="any", key="dw_sil_rule")
        duration = c.selectbox("For", list(DURATIONS), key="dw_sil_duration")
        who = st.text_input("Your name", key="dw_sil_by")
        comment = st.text_input("Comment", key="dw_sil_comment")
        if st.form_submit_button("Silence", key="dw_sil_submit"):
            matchers = [{"name": "workload", "value": workload}] if workload != "(any)" else []
            if rule.strip():
                matchers.append({"name": "alertname", "value": rule.strip()})
            try:
                create_silence(data.engine(f.url), matchers, now, now + DURATIONS[duration], who, comment, now)
            except ValueError as error:
                st.error(f"Not saved: {error}.")
            else:
                data.clear()
                st.success("Silence saved.")
    if active:
        left, right = st.columns([3, 1])
        ended = left.selectbox("End a silence", [s.id for s in active], key="dw_sil_expire")
        if right.button("End now", key="dw_sil_expire_button") and ended is not None:
            expire_silence(data.engine(f.url), int(ended), datetime.now(UTC))
            data.clear()
            st.rerun()


def _deliveries(f: Filters) -> None:
    st.subheader("Webhook deliveries")
    only_dead = st.toggle("Dead letters only", key="dw_dead_only")
    sent = data.notifications(f.url, ("dead",) if only_dead else None)
    dead = sum(n.status == "dead" for n in data.notifications(f.url, ("dead",)))
    if dead:
        st.warning(f"{dead} dead letter(s): deliveries that failed every retry. Check the receiver and its URL.")
    if not sent:
        st.caption("No deliveries yet." if not only_dead else "No dead letters.")
        return
    st.dataframe(
        [
            {
                "Created": _when(n.created_at),
                "Receiver": n.receiver,
                "Format": n.format,
                "Status": n.status,
                "Attempts": n.attempts,
                "Alerts": len(n.alerts),
                "Last HTTP status": n.last_status,
                "Last error": n.last_error or "",
                "Delivered": _when(n.delivered_at),
                "webhook-id": n.notification_id,
            }
            for n in sent
        ],
        hide_index=True,
        key="deliveries_table",
        placeholder=components.MISSING,
    )


def body(f: Filters) -> None:
    alerts = [a for a in data.alerts(f.url) if f.shows(a.labels.get("workload"))]
    columns = st.columns(3)
    for column, state in zip(columns, STATE_LABEL, strict=True):
        column.metric(STATE_LABEL[state], sum(a.state == state for a in alerts))
    if alerts:
        for state in STATE_LABEL:
            shown = [a for a in alerts if a.state == state]
            if shown:
                st.markdown(f"**{STATE_LABEL[state]}**")
                st.dataframe(alert_rows(shown), hide_index=True, key=f"alerts_{state}", placeholder=components.MISSING)
        if auth.is_admin():
            _ack_form(f, alerts)
    else:
        st.info(
            "No alerts. Alerts are raised by drift runs (`draftwatch drift run`, or the scheduler inside "
            "`draftwatch serve`); receivers are configured as webhooks (see docs/alerts.md)."
        )
    _silences(f)
    _deliveries(f)


components.live(body)
