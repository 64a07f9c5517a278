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
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from decoder.holdout import Holdout, HoldoutPolicy, HoldoutReason
from monitor.config import Settings
from monitor.log_safe import traceback_text
from monitor.proxy.pool import Member, Pool
from monitor.store.routing import latest_routing

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes; ``holdout_reason`` set when it is a baseline (plain) request."""

    member: Member
    holdout_reason: HoldoutReason | None = None

    @property
    def baseline(self) -> bool:
        return self.holdout_reason is not None


class Router:
    """Picks the replica of each proxied request (see the module docstring)."""

    def __init__(
        self, speculative: Pool, baseline: Pool, policy: HoldoutPolicy, *, baseline_policy: str = "share", seed: int = 0
    ) -> None:
        if not speculative:
            raise ValueError("the speculative pool needs at least one upstream (proxy.upstream)")
        if baseline_policy not in ("share", "member"):
            raise ValueError(f"baseline_policy must be share or member, got {baseline_policy!r}")
        self.speculative = speculative
        self.baseline = baseline
        self.baseline_policy = baseline_policy
        self._holdout = Holdout(policy, seed=seed)
        self._probe = Holdout(policy, seed=seed + 1)
        # Workloads the scheduler routed to plain; replaced whole by the refresh task.
        self.routed: frozenset[str] = frozenset()

    def choose(self, workload: str) -> Route:
        spec, base = self.speculative, self.baseline
        if not base:
            return Route(spec.pick())
        if workload in self.routed:
            if self._probe.draw(workload) is not None:
                return Route(spec.pick())
            return Route(base.pick(), "route")
        if self.baseline_policy == "member":
            member = spec.pick([*spec.members, *base.members])
            return Route(member, "member" if member.pool == "baseline" else None)
        reason = self._holdout.draw(workload)
        return Route(base.pick(), reason) if reason is not None else Route(spec.pick())

    def for_models(self) -> Route:
        """Where what is not a generation goes (``/v1/models``): the speculative pool."""
        return Route(self.speculative.pick())

    async def aclose(self) -> None:
        await self.speculative.aclose()
        await self.baseline.aclose()


def build_router(settings: Settings, seed: int = 0) -> Router:
    """The pools of ``proxy.upstream`` and ``proxy.baseline_upstream``, routed as the settings say."""
    proxy = settings.proxy
    router = Router(
        Pool.of("speculative", proxy.upstream, proxy.timeout_s),
        Pool.of("baseline", proxy.baseline_upstream, proxy.timeout_s),
        settings.holdout_policy,
        baseline_policy=proxy.baseline_policy,
        seed=seed,
    )
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


async def refresh_routes(router: Router, engine: Engine, every_s: float) -> None:
    """Keep ``router.routed`` to the scheduler's routing decisions; the read runs off the event loop.

    A database that is away or hung leaves the last known routes in place: the proxy keeps forwarding.
    """
    while True:
        try:
            latest = await asyncio.to_thread(latest_routing, engine)
        except Exception as error:  # the database is away: keep routing as last known
            log.debug("routing decisions not read: %s", traceback_text(error).splitlines()[-1])
        else:
            routed = frozenset(w for w, event in latest.items() if event.routed)
            if routed != router.routed:
                log.info("routing: workloads served by the plain baseline now: %s", ", ".join(sorted(routed)) or "none")
            router.routed = routed
        await asyncio.sleep(every_s)
