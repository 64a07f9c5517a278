"""Upstream pools: the replicas behind one name, balanced by least outstanding requests, failing ones set aside.

Each member counts the requests it has in flight. :meth:`Pool.pick` takes the member with the
fewest (the next in turn among equals, so that idle replicas share a trickle of traffic), and the
count at that moment, the request itself included, is the load the request ran at: the record keeps
it (``upstream_inflight``) so that speculative and plain requests are compared at matched load.
The turn is kept per set of members offered: the speculative pool's own (what passes through,
``/v1/models``, ``/tokenize``, and the generations of ``proxy.baseline_policy = share``) and its
members with the baseline's (the generations of ``member``) take turns apart, so that a client
listing the models before each completion cannot decide which of the two serves it.

Passive health (:class:`Ejection`): a member whose requests fail ``after`` times in a row (refused,
reset, timed out, or answered with the 502/503/504 of an engine that cannot serve) leaves the pool
for ``cooldown_s``, so that the requests meanwhile go to replicas that answer instead of failing
too. Then it is tried again, on trial: its next failure sends it out at once, its first answer
brings it back. With every member out the pool does not fail closed: the one due back first is
tried, since a request that might be served beats one refused for sure; and once one of them
answers, whatever put the whole pool out (an engine-wide 503, the network between) has passed for
the others too, so they are back on trial at once rather than left idle for their cool-down. Only
what the proxy sees counts (no probe traffic): an idle pool learns nothing, and needs nothing either.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from monitor.proxy.engine_state import EngineState
from monitor.proxy.upstream import Headers, Upstream, UpstreamError, UpstreamResponse

log = logging.getLogger(__name__)

PoolName = Literal["speculative", "baseline", "candidate"]
# The engine's own "cannot serve now" (a gateway in front of it, a replica still loading, overloaded).
UNAVAILABLE: Final = frozenset({502, 503, 504})


@dataclass(frozen=True, slots=True)
class Ejection:
    """When a failing member leaves its pool (``proxy.eject_after``), and for how long (``proxy.eject_cooldown_s``)."""

    after: int = 3
    cooldown_s: float = 30.0


@dataclass(slots=True, eq=False)
class Member:
    """One replica: its connections, the requests it has in flight, and whether it answers."""

    upstream: Upstream
    pool: PoolName
    ejection: Ejection = Ejection()
    inflight: int = 0
    # Whether its streams may be asked for usage: an engine that refused stream_options once is not asked again.
    takes_stream_options: bool = True
    # The stack its last recorded answer was read as (proxy.kind auto): what a failure's record names.
    stack: str | None = None
    # Failures in a row; out of the pool until out_until (time.monotonic()); up until it leaves, and again
    # once it answers after its cool-down.
    failures: int = 0
    out_until: float = 0.0
    up: bool = True
    # Its pool's members, itself included (set by the pool).
    peers: Sequence[Member] = field(default=(), repr=False)
    # What it last said about itself (monitor/proxy/engine_watch.py), for its requests' records.
    engine: EngineState = field(default_factory=EngineState, repr=False)

    def acquire(self) -> int:
        """Count one more request in flight; the load it starts at, itself included."""
        self.inflight += 1
        return self.inflight

    def release(self) -> None:
        self.inflight -= 1

    async def send(self, method: str, target: bytes, headers: Headers, body: bytes) -> UpstreamResponse:
        """:meth:`Upstream.send`, its outcome counted towards this member's health.

        Any status but the engine's "cannot serve" is an answer: a 4xx (a 413 for a body over the engine's
        limit, even one sent before the body was read) is the request's fault, not the replica's.
        """
        try:
            response = await self.upstream.send(method, target, headers, body)
        except UpstreamError as error:
            self.failed(str(error))
            raise
        if response.status in UNAVAILABLE:
            self.failed(f"status {response.status}")
        else:
            self.answered()
        return response

    def failed(self, why: str) -> None:
        self.failures += 1
        if self.failures < self.ejection.after:
            return
        self.out_until = time.monotonic() + self.ejection.cooldown_s
        if self.up:
            self.up = False
            log.warning("upstream %s left the %s pool for %g s: %d failures in a row, the last %s",
                        self.upstream.netloc, self.pool, self.ejection.cooldown_s, self.failures, why)  # fmt: skip
        # Back on trial after the cool-down: one more failure and it is out again.
        self.failures = self.ejection.after - 1

    def answered(self) -> None:
        self.failures = 0
        self.out_until = 0.0
        if not self.up:
            self.up = True
            log.info("upstream %s is back in the %s pool: it answered after its cool-down", self.upstream.netloc,
                     self.pool)  # fmt: skip
            self._others_on_trial()

    def _others_on_trial(self) -> None:
        """With none of the others up, the fault was the pool's: those still out are tried again now.

        Each is on trial (its failures in a row one short of ``after``): one more failure sends it out
        for a whole cool-down again. A member that failed alone while another served stays out.
        """
        others = [m for m in self.peers if m is not self]
        if not others or any(m.up for m in others):
            return
        now = time.monotonic()
        back = [m for m in others if m.out_until > now]
        for member in back:
            member.out_until = 0.0
        if back:
            log.info("upstream %s answered while the rest of the %s pool was out: %s back on trial",
                     self.upstream.netloc, self.pool, ", ".join(m.upstream.netloc for m in back))  # fmt: skip


@dataclass(slots=True)
class Pool:
    """Replicas serving the same model; the speculative pool, or the plain baseline."""

    name: PoolName
    members: list[Member] = field(default_factory=list)
    # The next in turn among equals, per set of members offered (see the module docstring).
    _turns: dict[tuple[Member, ...], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for member in self.members:
            member.peers = self.members

    @classmethod
    def of(cls, name: PoolName, urls: Sequence[str], timeout_s: float, ejection: Ejection = Ejection()) -> Pool:
        return cls(name, [Member(Upstream(url, timeout_s), name, ejection) for url in urls])

    def __bool__(self) -> bool:
        return bool(self.members)

    def pick(self, among: Sequence[Member] | None = None) -> Member:
        """The member in the pool with the fewest requests in flight (among equals, the next in turn).

        With every member out, the one due back first: never nothing.
        """
        members = self.members if among is None else among
        serving = _serving(members)
        least = min(m.inflight for m in serving)
        candidates = [m for m in serving if m.inflight == least]
        if len(candidates) == 1:
            return candidates[0]
        offered = tuple(members)
        turn = self._turns.get(offered, 0)
        self._turns[offered] = turn + 1
        return candidates[turn % len(candidates)]

    def next_load(self) -> int:
        """The load a request sent now would run at (:meth:`pick`'s member's in-flight count, itself included)."""
        return min(m.inflight for m in _serving(self.members)) + 1

    async def aclose(self) -> None:
        for member in self.members:
            await member.upstream.aclose()


def _serving(members: Sequence[Member]) -> list[Member]:
    """The members not out of the pool; with every one out, the one due back first."""
    now = time.monotonic()
    return [m for m in members if m.out_until <= now] or [min(members, key=lambda m: m.out_until)]
