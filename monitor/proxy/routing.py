"""The proxy's routing layer: which replica serves a request, and in which mode it is recorded.

Without a baseline every request goes to the speculative pool. With one
(``proxy.baseline_upstream``), the same model served without speculation, requests reach it in
one of two ways (``proxy.baseline_policy``):

* ``share``: the one holdout policy (:mod:`decoder.holdout`, ``decoder.holdout_*``) picks them per
  workload, as the embedded decoder's holdout does: a target per drift window at the max share,
  then the floor share. They are recorded as mode ``holdout`` with the policy's reason.
* ``member``: the baseline replicas are equal members of the least-outstanding-requests pool, so
  they run at the load the speculative replicas run at; a request that lands on one is recorded as
  ``holdout`` with reason ``member``.

A workload the scheduler has routed to plain (``proxy.on_net_loss = route``) goes to the baseline,
recorded as ``holdout`` with reason ``route``, except a probe share that the same holdout policy
draws: those keep reaching the speculative pool, so the speedup is still measured and the workload
can return. Either way both populations are random splits of the workload's own traffic.

A workload whose load crossover is measured (speculation gains or ties at low load and loses from N
in flight, :mod:`monitor.drift.detectors.crossover`) is routed by load instead: while the request
would run at N or more in flight on the speculative pool (:meth:`Pool.next_load`, the load the
records measure) it is routed as above, probes included; below N minus ``proxy.route_load_margin``
(and always at 1) it is served as an unrouted workload, the holdout share included, so that both curves stay
measured. Between the two it keeps the side it was on (hysteresis, per deployment).

A rollout (``draftwatch rollout``, :mod:`monitor.proxy.rollout`) gives a deployment's candidate
pool (``proxy.candidate_upstream``: the same target with a new drafter) a share of the requests
that would have gone to the speculative pool, per workload as the rollout's state in the store
says; they are recorded under the rollout's drafter name, speculative by declaration, so that the
judge compares them with the current drafter's requests of the same interval.

Several models (``[[proxy.routes]]``): each route is a :class:`Deployment` of its own, the pools of
the models its ``model`` glob matches, read as its ``kind`` says, with its own baseline if it has
one; a request's ``model`` picks the first route that matches, and the default deployment
(``proxy.upstream``, ``proxy.baseline_upstream``) takes the rest. Inside the deployment chosen,
everything above applies as it is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import functools
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy.engine import Connection, Engine

from decoder.holdout import BaselineDraw, HoldoutPolicy, HoldoutReason, process_seed
from monitor.config import Settings
from monitor.log_safe import traceback_text
from monitor.proxy.pool import Ejection, Member, Pool
from monitor.proxy.settings import ProxySettings
from monitor.store.rollouts import Rollout, active_rollouts
from monitor.store.routing import RoutingEvent, latest_routing

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True, eq=False)
class Deployment:
    """The pools serving the models ``model`` matches: speculative, its plain baseline and its candidate (may be empty).

    ``settings`` are the proxy's settings as this deployment's answers are read: ``proxy.*`` with
    the route's ``kind``.
    """

    model: str
    speculative: Pool
    baseline: Pool
    settings: ProxySettings
    candidate: Pool = dataclasses.field(default_factory=lambda: Pool("candidate"))

    def pool(self, name: str) -> Pool:
        """The pool a member belongs to, by its name."""
        return self.baseline if name == "baseline" else self.candidate if name == "candidate" else self.speculative

    @property
    def name(self) -> str:
        """What the logs call it: its first replica's host:port."""
        return self.speculative.members[0].upstream.netloc

    @property
    def speculative_role(self) -> bool | None:
        """What the parsers are told of the speculative pool's answers: speculative, plain, or None (infer it).

        With a baseline the roles are declared by the configuration: the pool behind ``upstream`` is
        the speculative one, so a request it answered without drafting (an n-gram drafter that found
        no match) still paid for speculation and is recorded as speculative with 0 drafts. Inferring
        it from the response would count such requests as plain: selection on the outcome, which
        made an n-gram deployment's net loss look like no comparison at all. Without a baseline
        nothing declares it but ``proxy.speculative``. A candidate pool declares it too: the rollout's
        judge compares the current drafter's requests with the candidate's, which are speculative by
        declaration, and the current side must not lose its requests that drafted nothing.
        """
        return True if self.baseline or self.candidate else self.settings.deployment_speculative


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes; ``holdout_reason`` set when it is a baseline (plain) request, ``drafter`` the
    rollout's drafter name when the candidate pool serves it."""

    member: Member
    deployment: Deployment
    holdout_reason: HoldoutReason | None = None
    drafter: str | None = None

    @property
    def baseline(self) -> bool:
        return self.holdout_reason is not None


class Router:
    """Picks the deployment and the replica of each proxied request (see the module docstring)."""

    def __init__(
        self,
        default: Deployment,
        policy: HoldoutPolicy,
        *,
        baseline_policy: str = "share",
        seed: int | None = None,
        routes: Sequence[Deployment] = (),
    ) -> None:
        for deployment in (*routes, default):
            if not deployment.speculative:
                raise ValueError(f"the deployment of model {deployment.model!r} needs at least one upstream")
        if baseline_policy not in ("share", "member"):
            raise ValueError(f"baseline_policy must be share or member, got {baseline_policy!r}")
        self.default = default
        self.routes = tuple(routes)
        self.baseline_policy = baseline_policy
        seed = process_seed(seed)
        self._draw = BaselineDraw(policy, seed=seed)
        self._candidate_draw = random.Random(seed + 2)
        # Workloads the scheduler routed to plain, those it routed by load (the crossover's in-flight count), and the
        # active rollout by deployment; replaced whole by the refresh.
        self.routed: frozenset[str] = frozenset()
        self.above: dict[str, int] = {}
        self.rollouts: dict[str, Rollout] = {}
        # (deployment, workload) routed by load and now on the baseline's side of its hysteresis.
        self._loaded: set[tuple[str, str]] = set()

    @property
    def deployments(self) -> tuple[Deployment, ...]:
        """The routes' deployments in order, then the default."""
        return (*self.routes, self.default)

    def deployment(self, model: object) -> Deployment:
        """The first route whose glob matches ``model`` (a request's body field, any type), else the default."""
        if isinstance(model, str):
            for deployment in self.routes:
                if fnmatch.fnmatchcase(model, deployment.model):
                    return deployment
        return self.default

    def choose(self, workload: str, model: object = None) -> Route:
        """The replica of a generation: its model's deployment, then the baseline policy inside it."""
        d = self.deployment(model)
        spec, base = d.speculative, d.baseline
        if d.settings.upstream_is_baseline:
            # A gateway split this request off (draftwatch routes export): routed there, or its holdout share.
            return Route(spec.pick(), d, "route" if workload in self.routed else "share")
        if d.settings.upstream_is_candidate:
            # A gateway split the rollout's share off (routes export --candidate-service): stored as the candidate's.
            rollout = self.rollouts.get(d.model)
            return Route(spec.pick(), d, drafter=rollout.drafter if rollout is not None and rollout.of_proxy else None)
        if not base:
            return self._speculative(d, workload)
        routed = workload in self.routed or self._over_crossover(d, workload)
        if self.baseline_policy == "member" and not routed:
            member = spec.pick([*spec.members, *base.members])
            return Route(member, d, "member") if member.pool == "baseline" else self._speculative(d, workload, member)
        reason = self._draw.draw(workload, routed)
        return Route(base.pick(), d, reason) if reason is not None else self._speculative(d, workload)

    def _over_crossover(self, d: Deployment, workload: str) -> bool:
        """Whether a workload routed by load is on the baseline's side of its crossover now, with hysteresis."""
        above = self.above.get(workload)
        if above is None:
            return False
        load, key = d.speculative.next_load(), (d.model, workload)
        # Back below the margin, but at 1 in flight always: a crossover at 2 must not hold its workload plain for good.
        stay = max(above - d.settings.route_load_margin, 2)
        if load >= above or (load >= stay and key in self._loaded):
            self._loaded.add(key)
            return True
        self._loaded.discard(key)
        return False

    def _speculative(self, d: Deployment, workload: str, member: Member | None = None) -> Route:
        """A speculative request: the candidate pool for the active rollout's share of it, else ``member`` or a pick."""
        rollout = self.rollouts.get(d.model)
        staged = rollout if rollout is not None and rollout.of_proxy and d.candidate else None  # not an embedded one's
        if staged is not None and self._candidate_draw.random() < staged.share(workload):
            return Route(d.candidate.pick(), d, drafter=staged.drafter)
        return Route(member or d.speculative.pick(), d)

    def passing(self, model: object = None) -> Route:
        """Where what is not a generation goes (``/v1/models``, embeddings, ...): its model's speculative pool."""
        d = self.deployment(model)
        return Route(d.speculative.pick(), d)

    def members(self) -> Iterable[Member]:
        for d in self.deployments:
            yield from d.speculative.members
            yield from d.baseline.members
            yield from d.candidate.members

    def upstreams_up(self) -> list[tuple[tuple[tuple[str, str], ...], float]]:
        """Each replica's labels (``upstream`` host:port, ``pool``) and 1 while it answers, 0 from its eject on."""
        return [((("upstream", m.upstream.netloc), ("pool", m.pool)), float(m.up)) for m in self.members()]

    async def aclose(self) -> None:
        for d in self.deployments:
            await d.speculative.aclose()
            await d.baseline.aclose()
            await d.candidate.aclose()


def build_router(settings: Settings, seed: int | None = None) -> Router:
    """The deployments of ``proxy.routes`` and the default one (``proxy.upstream``), routed as the settings say."""
    proxy = settings.proxy
    ejection = Ejection(proxy.eject_after, proxy.eject_cooldown_s)

    def deployment(
        model: str, upstream: Sequence[str], baseline: Sequence[str], candidate: Sequence[str], kind: str
    ) -> Deployment:
        return Deployment(
            model,
            Pool.of("speculative", upstream, proxy.timeout_s, ejection),
            Pool.of("baseline", baseline, proxy.timeout_s, ejection),
            proxy if kind == proxy.kind else dataclasses.replace(proxy, kind=kind),
            Pool.of("candidate", candidate, proxy.timeout_s, ejection),
        )

    routes = [deployment(r.model, r.upstream, r.baseline_upstream, r.candidate_upstream, r.kind or proxy.kind)
              for r in proxy.routes]  # fmt: skip
    router = Router(
        deployment("*", proxy.upstream, proxy.baseline_upstream, proxy.candidate_upstream, proxy.kind),
        settings.holdout_policy,
        baseline_policy=proxy.baseline_policy,
        seed=seed,
        routes=routes,
    )
    for d in router.routes:
        log.info("proxy route: model %s to %d upstream(s) at %s (%s), %d plain baseline(s)", d.model,
                 len(d.speculative.members), d.name, d.settings.kind, len(d.baseline.members))  # fmt: skip
    if proxy.baseline_upstream:
        how = "the holdout policy's share" if proxy.baseline_policy == "share" else "equal members of one pool"
        log.info(
            "proxy mode: speculative pool of %d, plain baseline of %d (%s); on a net loss: %s",
            len(proxy.upstream), len(proxy.baseline_upstream), how, proxy.on_net_loss,
        )  # fmt: skip
    else:
        log.info(
            "proxy mode: speculative pool of %d, no plain baseline: whether speculation pays is not measured "
            "(add --baseline-upstream URL, the same model served without speculation)",
            len(proxy.upstream),
        )
    return router


async def follow_store(
    engine: Engine, every_s: float, read: Callable[[Connection], T], take: Callable[[T], None], what: str
) -> None:
    """Hand ``take`` what ``read`` finds in the store, every ``every_s``; the reads run off the event loop.

    A database that is away or hung leaves the last known decisions in place: the sidecar keeps
    serving by them. ``what`` names the decisions in the log.
    """
    while True:
        try:
            found = await asyncio.to_thread(_read, engine, read)
        except Exception as error:  # the database is away: keep serving as last known
            log.debug("%s not read: %s", what, traceback_text(error).splitlines()[-1])
        else:
            take(found)
        await asyncio.sleep(every_s)


def _read(engine: Engine, read: Callable[[Connection], T]) -> T:
    with engine.connect() as conn:
        return read(conn)


async def refresh_routes(router: Router, engine: Engine, every_s: float) -> None:
    """Keep ``router.routed`` and ``router.rollouts`` to the scheduler's decisions (:func:`follow_store`)."""
    await follow_store(engine, every_s, _decisions, functools.partial(_take_decisions, router), "routing decisions")


def _decisions(conn: Connection) -> tuple[dict[str, RoutingEvent], dict[str, Rollout]]:
    return latest_routing(conn), active_rollouts(conn)


def _take_decisions(router: Router, decisions: tuple[dict[str, RoutingEvent], dict[str, Rollout]]) -> None:
    latest, rollouts = decisions
    routed = frozenset(w for w, event in latest.items() if event.routed and event.above_inflight is None)
    above = {w: event.above_inflight for w, event in latest.items() if event.above_inflight is not None}
    if routed != router.routed:
        log.info("routing: workloads served by the plain baseline now: %s", ", ".join(sorted(routed)) or "none")
    if above != router.above:
        log.info("routing: workloads served by the plain baseline from a load on: %s",
                 ", ".join(f"{w} from {n} in flight" for w, n in sorted(above.items())) or "none")  # fmt: skip
    router.routed, router.above = routed, above
    _take_rollouts(router, rollouts)


def served(rollout: Rollout) -> tuple[object, ...]:
    """What of a rollout decides where requests go (its judgement changes every run and does not)."""
    return rollout.id, rollout.status, rollout.step, sorted(rollout.workloads.items())


def _take_rollouts(router: Router, rollouts: dict[str, Rollout]) -> None:
    """Take the active rollouts, logging each change of one's state and any this sidecar cannot serve."""
    by_model = {d.model: d for d in router.deployments}
    for model, rollout in rollouts.items():
        before = router.rollouts.get(model)
        if before == rollout:
            continue
        d = by_model.get(model)
        if not rollout.of_proxy:
            log.warning("rollout %s of deployment %s is the embedded decoder's (its current drafters: %s): this "
                        "proxy's traffic stays on the current drafter", rollout.id, model,
                        ", ".join(rollout.current_drafters))  # fmt: skip
        elif d is None or not (d.candidate or d.settings.upstream_is_candidate):
            log.warning("rollout %s of deployment %s: this sidecar has no candidate pool for it "
                        "(proxy.candidate_upstream, or the route's candidate_upstream), so its traffic here stays "
                        "on the current drafter", rollout.id, model)  # fmt: skip
        elif before is None or served(before) != served(rollout):
            log.info("rollout %s of deployment %s: %s, the candidate %s serves %.0f%% of the speculative traffic%s",
                     rollout.id, model, rollout.status, rollout.drafter, 100 * rollout.step_share,
                     "".join(f"; {w}: {side}" for w, side in sorted(rollout.workloads.items())))  # fmt: skip
    for model in set(router.rollouts) - set(rollouts):
        log.info("rollout of deployment %s: ended, every speculative request goes to the current drafter", model)
    router.rollouts = rollouts
