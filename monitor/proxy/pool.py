"""Upstream pools: the replicas behind one name, balanced by least outstanding requests.

Each member counts the requests it has in flight. :meth:`Pool.pick` takes the member with the
fewest (the next in turn among equals, so that idle replicas share a trickle of traffic), and the
count at that moment, the request itself included, is the load the request ran at: the record keeps
it (``upstream_inflight``) so that speculative and plain requests are compared at matched load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from monitor.proxy.upstream import Upstream

PoolName = Literal["speculative", "baseline"]


@dataclass(slots=True, eq=False)
class Member:
    """One replica: its connections and the requests it has in flight."""

    upstream: Upstream
    pool: PoolName
    inflight: int = 0
    # Whether its streams may be asked for usage: an engine that refused stream_options once is not asked again.
    takes_stream_options: bool = True
    # The stack its last recorded answer was read as (proxy.kind auto): what a failure's record names.
    stack: str | None = None

    def acquire(self) -> int:
        """Count one more request in flight; the load it starts at, itself included."""
        self.inflight += 1
        return self.inflight

    def release(self) -> None:
        self.inflight -= 1


@dataclass(slots=True)
class Pool:
    """Replicas serving the same model; the speculative pool, or the plain baseline."""

    name: PoolName
    members: list[Member] = field(default_factory=list)
    _turn: int = 0

    @classmethod
    def of(cls, name: PoolName, urls: Sequence[str], timeout_s: float) -> Pool:
        return cls(name, [Member(Upstream(url, timeout_s), name) for url in urls])

    def __bool__(self) -> bool:
        return bool(self.members)

    def pick(self, among: Sequence[Member] | None = None) -> Member:
        """The member with the fewest requests in flight; among equals, the next in turn."""
        members = self.members if among is None else among
        least = min(m.inflight for m in members)
        self._turn += 1
        candidates = [m for m in members if m.inflight == least]
        return candidates[self._turn % len(candidates)]

    async def aclose(self) -> None:
        for member in self.members:
            await member.upstream.aclose()
