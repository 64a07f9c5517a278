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

With the workload's load curve measured against its own holdout (:func:`measured_curves`), a
crossover routes it by load instead (``route above N in flight``, :func:`load_reason`): from N in
flight its requests go plain, below it speculative (the proxy compares per request). A workload
that speculation loses at every load measured, or with no curve, is decided as above. A workload
routed by load moves to the new level when the crossover moves; with no crossover any more it is
routed whole on a measured net loss with every level losing, returns to speculation when no
measured level loses up to its level at least, and otherwise stays (a thin or tied curve changes
nothing: once routed, few speculative requests run at the loads above the crossover).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from sqlalchemy.engine import Engine

from monitor.drift.detectors.crossover import Curve
from monitor.drift.detectors.ledger import read_ledger
from monitor.drift.settings import DriftSettings
from monitor.drift.verdict import Verdict, busiest
from monitor.proxy.settings import ProxySettings
from monitor.store.routing import RoutingEvent, latest_routing, load_reason, record_switch

log = logging.getLogger(__name__)


def measured_curves(engine: Engine, config: DriftSettings, start: datetime, end: datetime) -> dict[str, Curve]:
    """Each workload's load curve over ``[start, end)`` against its own holdout: its busiest pair's."""
    curves: dict[str, tuple[int, Curve]] = {}
    for w in read_ledger(engine, config, start, end).workloads:
        n = sum(lv.n_spec for lv in w.curve.levels)
        if w.baseline == "holdout" and n > curves.get(w.workload, (-1, w.curve))[0]:
            curves[w.workload] = (n, w.curve)
    return {workload: curve for workload, (_, curve) in curves.items()}


def decide_routes(
    engine: Engine,
    settings: ProxySettings,
    verdicts: Sequence[Verdict],
    now: datetime,
    curves: Mapping[str, Curve] | None = None,
) -> list[RoutingEvent]:
    """Write and return the switches this run's verdicts and load curves call for (none unless ``on_net_loss`` is
    ``route``)."""
    if settings.on_net_loss != "route" or not settings.has_baseline:
        return []
    current = latest_routing(engine)
    switches = []
    for workload, v in sorted(busiest(v for v in verdicts if v.workload).items()):
        last = current.get(workload)
        if last is not None and now - last.ts < timedelta(seconds=settings.route_min_dwell_s):
            continue
        event = _decide(v, last, (curves or {}).get(workload), now)
        if event is not None:
            switches.append(event)
    with engine.begin() as conn:
        for event in switches:
            record_switch(conn, event)
    for event in switches:
        where = "the plain baseline" if event.routed else "the speculative pool"
        where += f" from {event.above_inflight} in flight" if event.above_inflight is not None else ""
        log.warning("routing: workload %s now goes to %s (%s)", event.workload, where, event.reason)
    return switches


def _decide(v: Verdict, last: RoutingEvent | None, curve: Curve | None, now: datetime) -> RoutingEvent | None:
    """The switch one workload's verdict and curve call for, if any (module docstring)."""
    routed, above = bool(last and last.routed), last.above_inflight if last is not None else None
    crossover = curve.crossover if curve is not None else None
    if crossover is not None and (not routed or above != crossover.inflight):
        why = load_reason(crossover.inflight, curve.note if curve else "")
        return _switch(v, True, why, now, above=crossover.inflight)
    if above is not None and curve is not None and crossover is None:
        measured = curve.measured
        if measured and all(lv.family_loses for lv in measured) and v.verdict == "net_loss" and v.measured:
            return _switch(v, True, f"net loss established at every load: {curve.note}", now)
        # Routed from ``above`` on, the speculative side is thin there (its probes only): only a curve that still
        # reaches that load and loses nowhere returns it, not one whose top levels went unmeasured.
        reaches = any(lv.inflight_high >= above for lv in measured)
        if reaches and not any(lv.family_loses for lv in measured):
            return _switch(v, False, f"speculation loses at no load measured now: {curve.note}", now)
        return None
    if above is not None:
        return None  # no curve this run: the load route holds
    if not routed and v.verdict == "net_loss" and v.measured:
        return _switch(v, True, f"net loss established: {v.reason}", now)
    if routed and v.verdict == "pays":
        return _switch(v, False, f"speculation pays again: {v.reason}", now)
    return None


def _switch(v: Verdict, routed: bool, reason: str, now: datetime, above: int | None = None) -> RoutingEvent:
    low, high = v.ci if v.ci else (None, None)
    target = (v.pair or "").rpartition("/")[0]
    return RoutingEvent(now, v.workload, target, routed, reason[:512], v.speedup, low, high, above)
