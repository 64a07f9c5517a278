"""What every page shares: the sidebar (time range, workload filter, auto-refresh), empty states, live bodies.

The sidebar widgets are drawn by ``app.py`` on every run, before the page, with fixed keys: their
values live in ``st.session_state`` and so carry over from page to page. Pages read them through
:func:`filters`, which recomputes "now", so an auto-refreshed fragment moves its window forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

import streamlit as st

from dashboard import data
from dashboard.timerange import DEFAULT_RANGE, RANGES, TimeRange, time_range

RANGE_KEY: Final = "dw_range"
WORKLOADS_KEY: Final = "dw_workloads"
REFRESH_KEY: Final = "dw_refresh"
REFRESH: Final = {"off": None, "every 30 s": 30, "every 1 min": 60, "every 5 min": 300}
DEFAULT_REFRESH: Final = "every 1 min"

NO_RECORDS: Final = (
    "**No records yet.** Run `draftwatch demo` to decode a few requests, or send events to the sidecar API "
    "(`POST /v1/events`, started with `draftwatch serve`). This page fills in as records arrive."
)


@dataclass(frozen=True, slots=True)
class Filters:
    """The sidebar's choices, resolved: database, time range and the workloads to show."""

    url: str
    range: TimeRange
    workloads: list[str]  # the selected ones, or every workload in the range when none is selected
    available: list[str]

    def shows(self, workload: str | None) -> bool:
        return workload is None or workload in self.workloads


def sidebar() -> None:
    """Draw the shared controls (called by app.py on every run, whatever the page)."""
    url = data.database_url()
    with st.sidebar:
        st.selectbox("Time range", list(RANGES), index=list(RANGES).index(DEFAULT_RANGE), key=RANGE_KEY)
        window = time_range(str(st.session_state.get(RANGE_KEY, DEFAULT_RANGE)))
        available = data.workloads(url, window.start, window.end)
        # A workload chosen earlier stays selectable even if it has no records in a narrower range.
        chosen = [w for w in st.session_state.get(WORKLOADS_KEY, []) if isinstance(w, str)]
        options = sorted(set(available) | set(chosen))
        st.multiselect("Workloads", options, key=WORKLOADS_KEY, placeholder="all workloads")
        st.selectbox("Auto-refresh", list(REFRESH), index=list(REFRESH).index(DEFAULT_REFRESH), key=REFRESH_KEY)
        st.caption(f"{window.label()}  \nCharts and tables are cached for {data.TTL_S} s.")


def filters() -> Filters:
    """The current choices; the time range ends with the current minute."""
    url = data.database_url()
    window = time_range(str(st.session_state.get(RANGE_KEY, DEFAULT_RANGE)))
    available = data.workloads(url, window.start, window.end)
    chosen = [w for w in st.session_state.get(WORKLOADS_KEY, []) if isinstance(w, str)]
    return Filters(url, window, chosen or available, available)


def refresh_interval() -> timedelta | None:
    seconds = REFRESH.get(str(st.session_state.get(REFRESH_KEY, DEFAULT_REFRESH)))
    return None if seconds is None else timedelta(seconds=seconds)


def live(body: Callable[[Filters], None]) -> None:
    """Run a page body in a fragment that reruns on the auto-refresh interval (only that part of the page)."""

    def run() -> None:
        body(filters())

    st.fragment(run, run_every=refresh_interval())()


def empty_state(f: Filters) -> bool:
    """Show what to do when there is nothing to show; True when the page should stop there."""
    if not data.has_records(f.url):
        st.info(NO_RECORDS, icon=":material/inbox:")
        return True
    if not f.available:
        st.info(
            f"No records between {f.range.label()}. Choose a longer time range in the sidebar "
            "(the newest records are older than this range).",
            icon=":material/schedule:",
        )
        return True
    if not [w for w in f.workloads if w in f.available]:
        st.info("The selected workloads have no records in this range: clear the workload filter in the sidebar.")
        return True
    return False


# What a figure nobody reported shows as, in text and in every table (st.dataframe's placeholder):
# Streamlit's own is the word None, which reads as a bug rather than as "not known".
MISSING: Final = "—"


def pct(value: float | None, digits: int = 1) -> str:
    """``0.834`` as ``83.4 %``; a dash for no value."""
    return MISSING if value is None else f"{value * 100:.{digits}f} %"


def num(value: float | None, digits: int = 2, unit: str = "") -> str:
    return MISSING if value is None else f"{value:.{digits}f}{unit}"
