"""Entry point of the Streamlit app: ``draftwatch dashboard`` (or ``streamlit run dashboard/app.py``).

Runs on every rerun of every page: login, the shared sidebar, then the chosen page.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard import auth, components

# Not "pages/": Streamlit treats a folder of that name next to the entry script as a legacy page list.
PAGES = Path(__file__).with_name("views")

st.set_page_config(page_title="draftwatch", page_icon=":material/speed:", layout="wide")
auth.require_login()
page = st.navigation(
    [
        st.Page(PAGES / "overview.py", title="Overview", icon=":material/dashboard:", default=True),
        st.Page(PAGES / "workload.py", title="Workload", icon=":material/insights:"),
        st.Page(PAGES / "drift.py", title="Drift", icon=":material/query_stats:"),
        st.Page(PAGES / "alerts.py", title="Alerts", icon=":material/notifications:"),
        st.Page(PAGES / "pairs.py", title="Pairs", icon=":material/compare_arrows:"),
        st.Page(PAGES / "rollouts.py", title="Rollouts", icon=":material/rocket_launch:"),
        st.Page(PAGES / "ledger.py", title="Ledger", icon=":material/payments:"),
    ]
)
components.sidebar()
page.run()
