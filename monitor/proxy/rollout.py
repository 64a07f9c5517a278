"""A candidate drafter rolled out like a canary: started, judged step by step, promoted or rolled back by itself.

``draftwatch rollout start`` (or ``POST /v1/rollouts``) stores a rollout for one deployment that
has a candidate pool (``proxy.candidate_upstream``, or a route's ``candidate_upstream``): the same
target served with the new drafter. Every sidecar reads it (:func:`monitor.proxy.routing.refresh_routes`)
and sends the current step's share of the deployment's speculative requests to the candidate.
The embedded decoder's candidate drafter (``decoder.candidate``) is the default deployment's
candidate where no proxy candidate pool is configured: the embedded server reads the rollout the
same way (:func:`monitor.api.decoding.staging.follow_rollout`) and sends the share of the requests
its controller plans to that drafter (decoder/candidate.py), judged against its portfolio's.

The scheduler's elected leader runs :func:`advance_rollouts` every ``scheduler.rollout_interval``.
Each run judges, per workload, the candidate's requests of the current step against the current
drafter's requests of the same step (:class:`monitor.drift.detectors.judge.Judge`), then:

* a workload **fails**: the rollout rolls back at once (every request to the current drafter),
  with the reason; with ``per_workload`` only that workload is kept on the current drafter and the
  rollout goes on with the others;
* the step has lasted ``rollout.interval`` and every judged workload **passes**: the next step;
  after the last step below 100 % the candidate is **promoted** (100 %: nothing would be left on
  the current drafter to judge it against): it serves everything, or, per workload,
  the workloads where it passed (the rest stay on the current drafter, a drafter chosen per
  workload; at the last step a workload the candidate served but never judged holds the
  promotion, as an undecided one does, so that each gets its own decision where it can);
* otherwise (a workload marginal, or none judged) the step is **held**: it goes on, its requests
  accumulating, for at most ``rollout.max_holds`` more intervals; then the rollout gives up and
  rolls back (per workload: the undecided workloads are kept on the current drafter). A hold is
  counted by a run, at most one a run and one an interval: the first run to find the step undecided
  after an interval ended (the judgement's ``held_at`` is that interval end's number), so intervals
  no run judged, while the scheduler was down, are no holds. It neither waits forever nor passes what
  it could not judge: each step's event lists the workloads left unjudged, and the promotion's reason
  the workloads never judged at all.

Every transition is a row of ``rollout_events`` and a line in the log; the alerts
``rollout_advanced``, ``rollout_rolled_back`` and ``rollout_promoted`` are raised from those rows.
A restart or a failover of the elected scheduler resumes from the stored state.

The candidate pool is the sidecars' setting (``serve --candidate-upstream``), and the command that
starts a rollout runs with settings of its own: every sidecar announces the candidates it serves in
the store (:func:`announce_candidates`, :mod:`monitor.store.candidates`), and a start whose own
settings name none takes the pool the sidecars announced (:func:`staged_for`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Final, Literal, NamedTuple

import numpy as np
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from decoder.candidate import DRAFTER_KINDS, Candidate
from monitor.drift.detectors.judge import Judge, Side, WorkloadJudgement
from monitor.drift.detectors.net_loss import Population
from monitor.drift.sampling import Sample, sample_requests
from monitor.log_safe import traceback_text
from monitor.proxy.settings import ProxySettings, RolloutSettings
from monitor.settings.masking import mask_urls
from monitor.settings.parsers import format_duration
from monitor.store.candidates import Announced, announce, announced
from monitor.store.reads.results import Pair
from monitor.store.rollouts import (
    CURRENT_DRAFTER,
    MAX_DRAFTER,
    SERVED_MODES,
    EventKind,
    Rollout,
    RolloutEvent,
    active_rollouts,
    get_rollout,
    insert_rollout,
    outcomes,
    record_event,
    save_rollout,
)
from monitor.store.types import Fence

log = logging.getLogger(__name__)

# The judgement's key for the interval end of the current step its last hold was counted at (1 for the first).
HELD_AT: Final = "held_at"
# A sidecar announces its candidates this often; a start counts what was announced within FRESH (three turns).
ANNOUNCE_S: Final = 60.0
FRESH: Final = timedelta(seconds=3 * ANNOUNCE_S)
RETRY_S: Final = 5.0  # after a failed announcement: a start right after the sidecar's must find it


class RolloutError(ValueError):
    """A rollout command that cannot be carried out; the message says why and what to do.

    ``field`` names the value refused (``route``, ``candidate``, ``drafter``) where a value is at
    fault; otherwise the state forbids it and ``code`` says which: ``no_candidate_pool``,
    ``rollout_active``, ``status_conflict``, ``not_found``.
    """

    def __init__(self, message: str, *, field: str | None = None, code: str = "invalid") -> None:
        super().__init__(message)
        self.field = field
        self.code = code


class Staged(NamedTuple):
    """Where a rollout's candidate runs: its deployment, the candidates configured there (``where``, the setting
    naming them), and the names the current side's requests are stored under."""

    deployment: str
    pool: tuple[str, ...]
    where: str
    current: tuple[str, ...]


def deployment_of(proxy: ProxySettings, route: int | None, embedded: Candidate | None = None) -> Staged:
    """The deployment a rollout is for (``*`` or route N's model glob) and its candidates.

    The default deployment is the proxy's (its candidate pool's URLs) where ``proxy.candidate_upstream``
    is set or no ``embedded`` candidate is (``decoder.candidate``); else the embedded decoder's, whose
    one candidate is that drafter.
    """
    if route is None:
        if proxy.candidate_upstream or embedded is None:
            return Staged("*", proxy.candidate_upstream, "proxy.candidate_upstream", (CURRENT_DRAFTER,))
        return Staged("*", (str(embedded),), "decoder.candidate", DRAFTER_KINDS)
    if not 1 <= route <= len(proxy.routes):
        raise RolloutError(f"route={route}: expected a route number 1-{len(proxy.routes)} of [[proxy.routes]]"
                           if proxy.routes else f"route={route}: no [[proxy.routes]] are configured",
                           field="route")  # fmt: skip
    chosen = proxy.routes[route - 1]
    return Staged(chosen.model, chosen.candidate_upstream, route_setting(route), (CURRENT_DRAFTER,))


def route_setting(route: int, *, of_candidate_sidecar: bool = False) -> str:
    """The setting naming route ``route``'s candidates, as announced: where ``rollout start --route N`` finds them."""
    if of_candidate_sidecar:
        return f"upstream of route {route} of a candidate sidecar"
    return f"candidate_upstream of route {route}"


def staged_for(
    engine: Engine, proxy: ProxySettings, now: datetime, route: int | None = None, embedded: Candidate | None = None
) -> Staged:
    """The deployment a rollout is for and its candidates: this process's settings' (:func:`deployment_of`), else
    those its sidecars announced within :data:`FRESH` of ``now``; refused where neither names any.

    Announced by several, a proxy's pool is the union of theirs, and it comes before an embedded
    decoder's drafter on the same deployment, as :func:`deployment_of` prefers ``proxy.candidate_upstream``.
    """
    if route is not None and not proxy.routes:  # the sidecars' routes, not configured where the rollout starts
        return _announced_route(engine, route, now)
    staged = deployment_of(proxy, route, embedded)
    if staged.pool:
        return staged
    found = announced(engine, staged.deployment, now - FRESH)
    chosen = [a for a in found if a.current_drafters == (CURRENT_DRAFTER,)] or found
    if not chosen:
        raise RolloutError(_no_pool(staged, route), code="no_candidate_pool")
    return _pooled(staged.deployment, chosen)


def _pooled(deployment: str, chosen: Sequence[Announced]) -> Staged:
    """One deployment's candidates as several sidecars announced them: the union of their pools."""
    sidecars = len({a.instance for a in chosen})
    where = f"{', '.join(sorted({a.setting for a in chosen}))} of {sidecars} sidecar{'s' if sidecars > 1 else ''}"
    pool = tuple(sorted({c for a in chosen for c in a.candidates}))
    return Staged(deployment, pool, where, chosen[0].current_drafters)


def _announced_route(engine: Engine, route: int, now: datetime) -> Staged:
    """Route ``route`` of the sidecars' ``[[proxy.routes]]`` as they announced it, where this process has none."""
    settings = {route_setting(route), route_setting(route, of_candidate_sidecar=True)}
    found = [a for a in announced(engine, None, now - FRESH) if a.setting in settings]
    deployments = sorted({a.deployment for a in found})
    if not deployments:
        raise RolloutError(
            f"route={route}: no [[proxy.routes]] are configured here and no sidecar announced a candidate pool for its "
            f"route {route} in the last {format_duration(FRESH)}: set candidate_upstream in the sidecars' "
            "[[proxy.routes]] table (or run rollout start with their [[proxy.routes]])",
            field="route",
        )
    if len(deployments) > 1:
        raise RolloutError(f"route={route}: the sidecars' route {route} is not one deployment but "
                           f"{', '.join(map(repr, deployments))}: run rollout start with their [[proxy.routes]]",
                           field="route")  # fmt: skip
    return _pooled(deployments[0], found)


def _no_pool(staged: Staged, route: int | None) -> str:
    """Why ``staged`` has no candidate pool, and exactly what to set where."""
    unseen = (f"deployment {staged.deployment!r} has no candidate pool: no sidecar announced one in the last "
              f"{format_duration(FRESH)} and {staged.where} is not set here; ")  # fmt: skip
    if route is not None:
        return (f"{unseen}set candidate_upstream in the sidecars' [[proxy.routes]] table for {staged.deployment!r} "
                "to the same target served with the new drafter, then start the rollout")  # fmt: skip
    return (f"{unseen}start the sidecars with serve --candidate-upstream URL (proxy.candidate_upstream, "
            "DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM: the same target served with the new drafter; the embedded decoder: "
            "serve --candidate-drafter, decoder.candidate), then start the rollout")  # fmt: skip


def served_here(proxy: ProxySettings, embedded: Candidate | None) -> list[Staged]:
    """The candidates a sidecar serves a rollout with, per deployment: its proxy's pools, else its embedded
    decoder's candidate drafter (what :func:`announce_candidates` announces).

    A gateway's candidate sidecar (``proxy.speculative = candidate``) serves its own upstreams as the
    candidates: the default one and each route's.
    """
    if proxy.upstream and proxy.upstream_is_candidate:
        where = "proxy.upstream of a candidate sidecar (proxy.speculative = candidate)"
        own = [Staged("*", proxy.upstream, where, (CURRENT_DRAFTER,))]
        own += [Staged(route.model, route.upstream, route_setting(number, of_candidate_sidecar=True),
                       (CURRENT_DRAFTER,)) for number, route in enumerate(proxy.routes, 1)]  # fmt: skip
        return own
    routes = range(1, len(proxy.routes) + 1) if proxy.upstream else range(0)
    # Not a proxy: a candidate_upstream set for it serves nothing, and the embedded decoder's drafter is the one.
    settings = proxy if proxy.upstream else ProxySettings()
    staged = [deployment_of(settings, None, embedded), *(deployment_of(settings, n) for n in routes)]
    return [s for s in staged if s.pool]


async def announce_candidates(engine: Engine, staged: Sequence[Staged], every_s: float = ANNOUNCE_S) -> None:
    """Announce ``staged`` in the store as this process's candidates now and every ``every_s``, until cancelled.

    A database that is away is tried again at the next turn: the sidecar serves meanwhile. The
    candidates' URLs are stored masked, as they are shown everywhere else.
    """
    instance = f"{socket.gethostname()}:{os.getpid()}"
    pools = [Announced(s.deployment, tuple(mask_urls(c) for c in s.pool), s.where, s.current) for s in staged]
    while True:
        try:
            await asyncio.to_thread(_announce, engine, instance, pools)
        except Exception as error:  # the database is away, or its schema not upgraded yet: try again soon
            log.debug("candidate pools not announced: %s", traceback_text(error).splitlines()[-1])
            await asyncio.sleep(min(every_s, RETRY_S))
        else:
            await asyncio.sleep(every_s)


def _announce(engine: Engine, instance: str, pools: Sequence[Announced]) -> None:
    with engine.begin() as conn:
        announce(conn, instance, pools, datetime.now(UTC))


def start_rollout(
    engine: Engine, proxy: ProxySettings, settings: RolloutSettings, now: datetime, *, route: int | None = None,
    candidate: str | None = None, embedded: Candidate | None = None,
) -> Rollout:  # fmt: skip
    """Store a new running rollout of ``settings``' steps on the deployment ``route`` names (None: the default).

    ``candidate``, where given, must be one of the deployment's configured candidates (a URL, or the
    embedded decoder's ``decoder.candidate``): a rollout sends users' requests only where the
    configuration already allows. ``embedded``: the embedded decoder's candidate drafter, which
    makes the default deployment the embedded decoder's when no proxy candidate pool is set.
    """
    return start_staged(engine, staged_for(engine, proxy, now, route, embedded), settings, now, candidate=candidate)


def start_staged(
    engine: Engine, staged: Staged, settings: RolloutSettings, now: datetime, *, candidate: str | None = None
) -> Rollout:
    """:func:`start_rollout` on the deployment and candidates :func:`staged_for` found."""
    deployment, pool, where, current = staged
    if candidate is not None and mask_urls(candidate.rstrip("/")) not in map(mask_urls, pool):
        raise RolloutError(f"candidate={candidate!r} is not in {where} ({len(pool)} configured): a rollout only sends "
                           "traffic to a configured candidate; add it there first", field="candidate")  # fmt: skip
    name = settings.drafter.strip()
    reserved = (CURRENT_DRAFTER, "none", *DRAFTER_KINDS)
    if not name or len(name) > MAX_DRAFTER or name in reserved:
        raise RolloutError(f"rollout.drafter={settings.drafter!r}: expected a name for the candidate drafter, at "
                           f"most {MAX_DRAFTER} characters, other than {', '.join(map(repr, reserved))} (the names "
                           "the current drafters are stored under)", field="drafter")  # fmt: skip
    new = Rollout(
        deployment,
        name,
        settings.steps,
        settings.interval.total_seconds(),
        settings.per_workload,
        now,
        now,
        reason=f"started: {_shares(settings.steps)}, {settings.interval.total_seconds():g} s a step",
        current_drafters=current,
    )
    try:
        with engine.begin() as conn:
            active = active_rollouts(conn).get(deployment)
            if active is not None:
                raise _active(active)
            rollout = insert_rollout(conn, new)
            event = _event(rollout, now, "started", rollout.reason)
            record_event(conn, event)
    except IntegrityError:  # another start on the deployment committed first: one active rollout per deployment
        raced = active_rollouts(engine).get(deployment)
        if raced is None:
            raise
        raise _active(raced) from None
    _log(rollout, event)
    return rollout


def _active(active: Rollout) -> RolloutError:
    return RolloutError(f"rollout {active.id} is {active.status} on deployment {active.deployment!r}: one rollout at "
                        f"a time; promote or abort it first (draftwatch rollout abort {active.id}, or POST "
                        f"/v1/rollouts/{active.id}/abort)", code="rollout_active")  # fmt: skip


def promote(engine: Engine, rollout_id: int, now: datetime) -> Rollout:
    """Promote a running rollout by hand: the candidate serves every workload not already kept on the current one.

    Per workload too: the operator's promotion is not limited to the workloads the judge passed.
    """
    return _finish(engine, rollout_id, now, "promoted", "promoted by hand")


def abort(engine: Engine, rollout_id: int, now: datetime, reason: str = "aborted by hand") -> Rollout:
    """End a running or promoted rollout: every request goes to the current drafter again."""
    return _finish(engine, rollout_id, now, "aborted", reason)


def _finish(
    engine: Engine, rollout_id: int, now: datetime, kind: Literal["promoted", "aborted"], reason: str
) -> Rollout:
    with engine.begin() as conn:
        rollout = get_rollout(conn, rollout_id, lock=True)
        if rollout is None:
            raise RolloutError(f"no rollout {rollout_id}: draftwatch rollout status (GET /v1/rollouts) lists them",
                               code="not_found")  # fmt: skip
        allowed = ("running",) if kind == "promoted" else ("running", "promoted")
        if rollout.status not in allowed:
            raise RolloutError(f"rollout {rollout_id} is {rollout.status}: only a {' or '.join(allowed)} one can be "
                               f"{kind}", code="status_conflict")  # fmt: skip
        # A promotion by hand gives the candidate every workload not kept, as a whole rollout's does.
        per_workload = rollout.per_workload and kind != "promoted"
        done = replace(rollout, status=kind, finished_at=now, reason=reason[:1024], per_workload=per_workload)
        save_rollout(conn, done)
        event = _event(done, now, kind, done.reason)
        record_event(conn, event)
    _log(done, event)
    return done


def advance_rollouts(
    engine: Engine, settings: RolloutSettings, now: datetime, *, sample_size: int = 2000, fence: Fence | None = None
) -> list[RolloutEvent]:
    """Judge every running rollout's current step and write what it calls for (see the module docstring)."""
    judge = Judge(tolerance=settings.tolerance, min_requests=settings.min_requests,
                  max_extra_errors=settings.max_extra_errors, ci_level=settings.ci_level)  # fmt: skip
    events: list[RolloutEvent] = []
    for rollout in active_rollouts(engine).values():
        if rollout.status != "running":
            continue
        with engine.connect() as conn:
            judgements = judge_step(conn, rollout, judge, now, sample_size)
        updated, new = _decide(rollout, judgements, settings.max_holds, now)
        with engine.begin() as conn:
            if fence is not None:
                fence(conn)
            stored = get_rollout(conn, rollout.id or 0, lock=True)
            if stored is None or (stored.status, stored.step) != (rollout.status, rollout.step):
                # Promoted or aborted by hand while it was judged: that decision stands.
                continue
            save_rollout(conn, updated)
            for event in new:
                record_event(conn, event)
        for event in new:
            _log(updated, event)
        events += new
    return events


def judge_step(
    conn: Connection, rollout: Rollout, judge: Judge, now: datetime, sample_size: int
) -> dict[str, WorkloadJudgement]:
    """Per workload on the candidate's side of the rollout, its judgement over the current step so far.

    A workload served for several targets (a deployment of several models) is judged on its busiest
    one, the target with the most candidate requests, as its verdict is on its busiest pair. A side
    is every request of the workload and target stored under its names, whatever the draft model:
    the embedded decoder's current side is its whole portfolio, a draft model and the n-gram drafter.
    """
    start = rollout.step_started_at
    candidate = _by_target(outcomes(conn, (rollout.drafter,), start, now))
    current = _by_target(outcomes(conn, rollout.current_drafters, start, now))
    found: dict[str, WorkloadJudgement] = {}
    for key in sorted(candidate, key=lambda k: (-sum(n for n, _ in candidate[k].values()), k)):
        workload, _target = key
        if workload in rollout.workloads or workload in found:
            continue
        sides = []
        for pairs in (candidate[key], current.get(key, {})):
            samples = [sample_requests(conn, workload, pair, start, now, sample_size, mode=SERVED_MODES)
                       for pair in sorted(pairs, key=lambda p: (p.drafter, p.draft_model or ""))]  # fmt: skip
            n, errors = sum(count for count, _ in pairs.values()), sum(failed for _, failed in pairs.values())
            sides.append(_side(_joined(samples), n, errors))
        found[workload] = judge.judge(workload, *sides)
    return found


def _by_target(
    counts: Mapping[tuple[str, str, str, str | None], tuple[int, int]],
) -> dict[tuple[str, str], dict[Pair, tuple[int, int]]]:
    """:func:`outcomes` by (workload, target), each with its pairs' requests and failures."""
    grouped: dict[tuple[str, str], dict[Pair, tuple[int, int]]] = {}
    for (workload, target, drafter, draft_model), n in counts.items():
        grouped.setdefault((workload, target), {})[Pair(target, drafter, draft_model)] = n
    return grouped


def _joined(samples: Sequence[Sample]) -> Sample:
    """One side's samples of its pairs as one sample (a portfolio's requests are one population); empty for none."""
    if len(samples) == 1:
        return samples[0]
    columns = {name: [getattr(s, name) for s in samples] for name in Sample.__dataclass_fields__}
    return Sample(**{name: np.concatenate(arrays) if arrays else np.zeros(0, dtype=str if name == "mode" else float)
                     for name, arrays in columns.items()})  # fmt: skip


def _side(sample: Sample, n: int, errors: int) -> Side:
    speed = sample.decode_ms_per_token
    timed = np.isfinite(speed)
    ttft = sample.ttft_ms[np.isfinite(sample.ttft_ms)]
    drafted = sample.drafted > 0
    acceptance = sample.accepted[drafted] / sample.drafted[drafted]
    population = Population(speed[timed], sample.context_tokens[timed], sample.upstream_inflight[timed])
    return Side(population, ttft, acceptance, n, errors)


def _decide(
    rollout: Rollout, judgements: Mapping[str, WorkloadJudgement], max_holds: int, now: datetime
) -> tuple[Rollout, list[RolloutEvent]]:
    """The rollout after this run's judgements, and the events of what changed."""
    interval = timedelta(seconds=rollout.interval_s)
    seen = _judged_ever(rollout)
    state = {"interval": [rollout.step_started_at.isoformat(), now.isoformat()],
             "workloads": {w: j.to_json() for w, j in judgements.items()}, "judged": sorted(seen)}  # fmt: skip
    r = replace(rollout, judgement=state)
    events: list[RolloutEvent] = []
    failed = {w: j for w, j in judgements.items() if j.outcome == "fail"}
    if failed and not r.per_workload:
        reason = "; ".join(f"{w}: {j.reason}" for w, j in failed.items())
        return _ended(r, now, "rolled_back", f"rolled back at step {r.step + 1}: {reason}", events)
    if failed:
        r = _keep(r, failed, now, events, "failed")
        if all(w in r.workloads for w in judgements):
            reason = "; ".join(f"{w}: {j.reason}" for w, j in failed.items())
            return _ended(r, now, "rolled_back", f"rolled back: kept off every workload it served; {reason}", events)
    elapsed = now - r.step_started_at
    if elapsed < interval:
        return r, events
    open_ = {w: j for w, j in judgements.items() if w not in r.workloads}
    judged = {w: j for w, j in open_.items() if j.outcome != "unjudged"}
    unjudged = sorted(w for w, j in open_.items() if j.outcome == "unjudged")
    undecided = {w: j for w, j in judged.items() if j.outcome != "pass"}
    # Per workload, the promotion is each workload's last word: one the candidate served that is still too
    # small to judge holds it while holds remain, rather than staying on the current drafter unjudged because
    # another workload passed first.
    waiting = r.per_workload and r.step + 2 >= len(r.steps) and any(w not in seen for w in unjudged)
    if judged and not undecided and not waiting:
        seen |= set(judged)
        r = replace(r, judgement={**state, "judged": sorted(seen)})
        return _next_step(r, judged, unjudged, seen, now, events)
    # A hold is counted by a run that finds the step undecided in a later interval than the last hold's: at
    # most one a run. Counted by the time since the step began, a scheduler outage longer than max_holds
    # intervals would roll the step back at the first run after it, on intervals no judge looked at.
    ended = int(elapsed / interval)  # interval ends this step has passed, this one included
    last = _held_at(rollout)
    if ended <= last:
        return replace(r, judgement={**state, HELD_AT: last}), events
    holds = r.holds + 1
    r = replace(r, holds=holds, judgement={**state, HELD_AT: ended})
    if holds <= max_holds:
        why = _undecided(undecided, unjudged)
        events.append(_event(r, now, "held", f"step {r.step + 1} held ({holds} of {max_holds}): {why}"))
        return r, events
    why = f"no decision after {holds} intervals at step {r.step + 1}: {_undecided(undecided, unjudged)}"
    if r.per_workload and len(undecided) < len(judged):
        if undecided:
            r = _keep(r, undecided, now, events, "undecided")
        passing = {w: j for w, j in judged.items() if w not in undecided}
        return _next_step(r, passing, unjudged, seen | set(passing), now, events)
    return _ended(r, now, "rolled_back", f"rolled back: {why}", events)


def _next_step(
    r: Rollout, passing: Mapping[str, WorkloadJudgement], unjudged: Sequence[str], seen: set[str], now: datetime,
    events: list[RolloutEvent],
) -> tuple[Rollout, list[RolloutEvent]]:  # fmt: skip
    scores = ", ".join(f"{w} {j.score}" for w, j in sorted(passing.items()))
    left = f"; unjudged (too few requests): {', '.join(unjudged)}" if unjudged else ""
    # The last step (100 %) is the promotion itself: with every request on the candidate, nothing would be
    # left on the current drafter to judge it against.
    if r.step + 2 < len(r.steps):
        r = replace(r, step=r.step + 1, step_started_at=now, holds=0)
        events.append(_event(r, now, "advanced", f"step {r.step + 1} of {len(r.steps)}: every judged workload "
                                                 f"passed (scores {scores}){left}"))  # fmt: skip
        return r, events
    workloads = dict(r.workloads)
    if r.per_workload:
        # Every workload that passed a step and was not kept since: at the last step too few to judge
        # is no reason to take back what the earlier steps showed.
        workloads.update({w: "candidate" for w in sorted(seen) if w not in workloads})
        if not any(side == "candidate" for side in workloads.values()):
            return _ended(r, now, "rolled_back", "rolled back: the candidate passed on no workload", events)
    never = sorted(set(unjudged) - seen)
    unseen = f"; never judged (too few requests), left on the current drafter: {', '.join(never)}" if never else ""
    if not r.per_workload and never:
        unseen = f"; never judged (too few requests), promoted with the rest: {', '.join(never)}"
    kept = sorted(w for w, side in workloads.items() if side == "current")
    where = f"; kept on the current drafter: {', '.join(kept)}" if kept else ""
    return _ended(
        replace(r, workloads=workloads),
        now,
        "promoted",
        f"promoted: every judged workload passed the last step (scores {scores}){where}{unseen}",
        events,
    )


def _keep(
    r: Rollout, workloads: Mapping[str, WorkloadJudgement], now: datetime, events: list[RolloutEvent], how: str
) -> Rollout:
    """Per workload: keep ``workloads`` on the current drafter for the rest of the rollout."""
    r = replace(r, workloads={**r.workloads, **{w: "current" for w in workloads}})
    for w, j in sorted(workloads.items()):
        events.append(_event(r, now, "kept", f"{w} kept on the current drafter ({how}): {j.reason}", workload=w))
    return r


def _ended(
    r: Rollout, now: datetime, kind: Literal["promoted", "rolled_back"], reason: str, events: list[RolloutEvent]
) -> tuple[Rollout, list[RolloutEvent]]:
    r = replace(r, status=kind, finished_at=now, reason=reason[:1024])
    events.append(_event(r, now, kind, r.reason))
    return r, events


def _judged_ever(rollout: Rollout) -> set[str]:
    return set(rollout.judgement.get("judged", ()))


def _held_at(rollout: Rollout) -> int:
    """The interval end of the current step its last hold was counted at (the 1st, 2nd...); 0 before any hold.

    A rollout stored before :data:`HELD_AT` was kept was held at every interval end up to its ``holds``.
    """
    if not rollout.holds:
        return 0
    return int(rollout.judgement.get(HELD_AT, rollout.holds))


def _undecided(undecided: Mapping[str, WorkloadJudgement], unjudged: Sequence[str]) -> str:
    parts = [f"{w} {j.outcome}: {j.reason}" for w, j in sorted(undecided.items())]
    if unjudged:
        parts.append(f"unjudged (too few requests): {', '.join(unjudged)}")
    return "; ".join(parts) or "no workload judged yet"


def _event(r: Rollout, now: datetime, kind: EventKind, reason: str, workload: str | None = None) -> RolloutEvent:
    assert r.id is not None
    share = 0.0 if kind in ("rolled_back", "aborted") else r.step_share
    return RolloutEvent(r.id, now, kind, r.step, share, reason[:1024], workload, dict(r.judgement))


def _log(r: Rollout, event: RolloutEvent) -> None:
    level = logging.WARNING if event.kind in ("rolled_back", "kept") else logging.INFO
    log.log(level, "rollout %s (%s on %s): %s", r.id, r.drafter, r.deployment, event.reason)


def _shares(steps: Sequence[float]) -> str:
    return "steps " + ", ".join(f"{100 * s:g}%" for s in steps)
