"""The firing-alerts banner shown on top of the Overview."""

from __future__ import annotations

import streamlit as st

from dashboard import data


def firing_banner(url: str) -> None:
    """One line per firing alert (unacknowledged ones first); nothing when none fires."""
    firing = [a for a in data.alerts(url, ("firing",)) if a.state == "firing"]
    if not firing:
        return
    firing.sort(key=lambda a: (a.acked_at is not None, a.severity != "critical"))
    lines = []
    for a in firing[:8]:
        where = ", ".join(f"{k}={v}" for k, v in sorted(a.labels.items()) if k != "alertname")
        ack = f" — acknowledged by {a.acked_by}" if a.acked_at else ""
        lines.append(f"- **{a.rule}** ({a.severity}) {where}: {a.summary or 'firing'}{ack}")
    more = f"\n\n…and {len(firing) - 8} more." if len(firing) > 8 else ""
    st.error(f"**{len(firing)} alert(s) firing** (see Alerts):\n" + "\n".join(lines) + more, icon=":material/warning:")
