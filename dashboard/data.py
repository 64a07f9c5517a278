"""Every read of the dashboard: monitor/'s query functions behind Streamlit caches.

Pages never touch SQL or an engine; they call these. Results are cached for :data:`TTL_S` seconds
keyed on the database URL and the arguments, so a page's reruns (a widget change, auto-refresh)
within that time cost nothing, and several people looking at once share the figures. Time ranges
end on the next minute boundary, so the keys change at most once a minute anyway.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

import streamlit as st
from sqlalchemy.engine import Engine

from monitor.alerts import queries as alert_queries
from monitor.alerts.silences import Silence, list_silences
from monitor.config import Settings, default_config_file
from monitor.drift import queries as drift_queries
from monitor.drift.detectors.ledger import Ledger, read_ledger
from monitor.settings.masking import mask_urls
from monitor.store import evaluations as stored_evaluations
from monitor.store import rollouts as stored_rollouts
from monitor.store import routing, scrape
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.reads import dashboard as dq
from monitor.store.reads import queries
from monitor.store.settings import DatabaseSettings

log = logging.getLogger(__name__)

TTL_S: Final = 30


def _database() -> DatabaseSettings:
    return Settings.from_env(os.environ, default_config_file(os.environ, Path.cwd())).database


def database_url() -> str:
    """The store's URL from the settings (``DRAFTWATCH_DATABASE_URL`` or ``draftwatch.toml``)."""
    return _database().url


@st.cache_resource(show_spinner=False)
def engine(url: str) -> Engine:
    """One engine (connection pool) per URL for the whole server process."""
    created = create_engine(url)
    # A fresh store (first start, before any record) has no tables yet: migrate so that pages can
    # show their empty state instead of an error. Same call the API makes at start-up.
    upgrade(created, database=_database())
    log.info("dashboard reading %s", mask_urls(created.url.render_as_string(hide_password=True)))
    return created


@st.cache_data(ttl=TTL_S, show_spinner=False)
def has_records(url: str) -> bool:
    return dq.has_records(engine(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def workloads(url: str, start: datetime, end: datetime) -> list[str]:
    return queries.workloads(engine(url), start, end)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def summaries(
    url: str,
    start: datetime,
    end: datetime,
    workload: str | None = None,
    mode: str | None = None,
    lengths_too: bool = True,
) -> list[queries.WorkloadSummary]:
    return queries.workload_summaries(engine(url), start, end, workload=workload, mode=mode, lengths_too=lengths_too)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def current_settings(url: str, start: datetime, end: datetime) -> dict[str, dq.CurrentSetting]:
    return dq.current_settings(engine(url), start, end)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def speedup_inputs(
    url: str, workload: str, start: datetime, end: datetime, pair: queries.Pair | None = None
) -> dq.SpeedupInputs | None:
    return dq.speedup_inputs(engine(url), workload, start, end, pair=pair)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def time_series(url: str, workload: str, start: datetime, end: datetime, step: timedelta) -> list[queries.SeriesPoint]:
    return queries.time_series(engine(url), workload, start, end, step=step)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def latency_series(url: str, workload: str, start: datetime, end: datetime, step: timedelta) -> list[dq.LatencyPoint]:
    return dq.latency_series(engine(url), workload, start, end, step=step)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def position_acceptance(url: str, workload: str, start: datetime, end: datetime) -> list[queries.PositionAcceptance]:
    return queries.position_acceptance(engine(url), workload, start, end)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def length_histogram(url: str, workload: str, start: datetime, end: datetime) -> list[queries.LengthBin]:
    return queries.acceptance_length_histogram(engine(url), workload, start, end)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def routing_switches(url: str, start: datetime, end: datetime, workload: str) -> list[routing.RoutingEvent]:
    return routing.routing_events(engine(url), start, end, workload)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def rollouts(url: str) -> list[stored_rollouts.Rollout]:
    """Drafter rollouts of every status, newest first."""
    return stored_rollouts.rollouts(engine(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def rollout_events(url: str, rollout_id: int) -> list[stored_rollouts.RolloutEvent]:
    """One rollout's events, oldest first."""
    return stored_rollouts.rollout_events(engine(url), rollout_id=rollout_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def deployment_events(url: str, start: datetime, end: datetime) -> list[queries.DeploymentEvent]:
    return queries.deployment_events(engine(url), start, end)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def pair_summaries(url: str, start: datetime, end: datetime) -> list[dq.PairSummary]:
    return dq.pair_summaries(engine(url), start, end)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def latest_drift_run(url: str) -> drift_queries.StoredRun | None:
    return drift_queries.latest_run(engine(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def latest_drift_results(url: str) -> list[drift_queries.StoredResult]:
    return drift_queries.latest_results(engine(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def split_history(url: str, start: datetime, end: datetime) -> list[tuple[datetime, dict[str, Any]]]:
    return drift_queries.split_history(engine(url), start, end)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def drift_history(
    url: str,
    start: datetime,
    end: datetime,
    workload: str | None = None,
    decision: str | None = None,
    test: str | None = None,
    limit: int = 1000,
) -> list[drift_queries.StoredResult]:
    return drift_queries.results_history(
        engine(url), workload=workload, decision=decision, test=test, start=start, end=end, limit=limit
    )


@st.cache_data(ttl=TTL_S, show_spinner=False)
def alerts(url: str, states: tuple[str, ...] = alert_queries.SHOWN_STATES) -> list[alert_queries.AlertItem]:
    return alert_queries.list_alerts(engine(url), states)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def notifications(url: str, statuses: tuple[str, ...] | None = None) -> list[alert_queries.NotificationItem]:
    return alert_queries.list_notifications(engine(url), statuses)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def silences(url: str, now: datetime) -> list[Silence]:
    return list_silences(engine(url), now, include_expired=False)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def scraped(url: str, start: datetime, end: datetime) -> list[scrape.ScrapedSummary]:
    return scrape.scraped_summaries(engine(url), start, end)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def scrape_targets(url: str) -> list[scrape.TargetHealth]:
    return scrape.target_health(engine(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def evaluations(url: str) -> list[stored_evaluations.StoredEvaluation]:
    return stored_evaluations.latest_evaluations(engine(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def ledger(url: str, start: datetime, end: datetime, prices: tuple[tuple[str, float], ...] = ()) -> Ledger:
    """The speculation ledger over ``[start, end)`` (the ratios read from bounded samples, the tokens summed)."""
    drift = Settings.from_env(os.environ, default_config_file(os.environ, Path.cwd())).drift
    return read_ledger(engine(url), drift, start, end, dict(prices))


def clear() -> None:
    """Forget cached figures: after an acknowledgement or a new silence the page must show the change."""
    st.cache_data.clear()
