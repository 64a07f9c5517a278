"""Acting on the verdict (``proxy.on_net_loss = route``): route a losing workload to plain, and back.

After each drift run the scheduler compares every workload's net-loss verdict with its current route:

* served by speculation, and a **measured** net loss (the workload's own baseline requests, not an
  estimate from other workloads): route it to the plain baseline;
* routed to plain, and the speculative probes' speedup is back above 1 with its lower bound
  (verdict ``pays``): return it to speculation.

The gap between "upper bound below 1" and "lower bound above 1" is the hysteresis: an inconclusive
verdict changes nothing. ``proxy.route_min_dwell_s`` is the least time between two switches of one
workload, so that a verdict that swings between runs cannot flap the route. Every switch is a row of
``routing_events`` (the proxy reads it, the dashboard marks it, the health check raises
``routing_changed``) and a line in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy.engine import Engine

from monitor.drift.verdict import Verdict, busiest
from monitor.proxy.settings import ProxySettings
from monitor.store.routing import RoutingEvent, latest_routing, record_switch

log = logging.getLogger(__name__)


def decide_routes(
    engine: Engine, settings: ProxySettings, verdicts: Sequence[Verdict], now: datetime
) -> list[RoutingEvent]:
    """Write and return the switches this run's verdicts call for (none unless ``on_net_loss`` is ``route``)."""
    if settings.on_net_loss != "route" or not settings.has_baseline:
        return []
    current = latest_routing(engine)
    switches = []
    for workload, v in sorted(busiest(v for v in verdicts if v.workload).items()):
        last = current.get(workload)
        routed = bool(last and last.routed)
        if last is not None and now - last.ts < timedelta(seconds=settings.route_min_dwell_s):
            continue
        if not routed and v.verdict == "net_loss" and v.measured:
            switches.append(_switch(v, True, f"net loss established: {v.reason}", now))
        elif routed and v.verdict == "pays":
            switches.append(_switch(v, False, f"speculation pays again: {v.reason}", now))
    with engine.begin() as conn:
        for event in switches:
            record_switch(conn, event)
    for event in switches:
        where = "the plain baseline" if event.routed else "the speculative pool"
        log.warning("routing: workload %s now goes to %s (%s)", event.workload, where, event.reason)
    return switches


def _switch(v: Verdict, routed: bool, reason: str, now: datetime) -> RoutingEvent:
    low, high = v.ci if v.ci else (None, None)
    target = (v.pair or "").rpartition("/")[0]
    return RoutingEvent(now, v.workload, target, routed, reason[:512], v.speedup, low, high)
