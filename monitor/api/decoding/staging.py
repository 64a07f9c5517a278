"""The embedded decoder's side of a rollout: its deployment's active rollout, from the store, given to the decoder.

``draftwatch serve --target T --drafter ngram --candidate-drafter ngram:1-1`` (``decoder.candidate``)
loads a candidate drafter beside the portfolio; it serves nothing until a rollout stages it. Every
``proxy.route_refresh_s``, as a proxy's sidecar reads its routes (:func:`monitor.proxy.routing.follow_store`),
the server reads the active rollout of its deployment (the default one, ``*``: proxy mode and
``--target`` exclude each other) and makes it the decoder's staging (decoder/candidate.py): the
decoder then sends the rollout's share of each workload's requests to the candidate, recorded under
the rollout's drafter name. Promoted, the candidate serves every request its workloads' share says
(all of them, or per workload those it won); rolled back or aborted, none. A proxy's rollout on
the same deployment (its current side the ``upstream`` pool) is not this decoder's: it is logged
and served by nothing here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from sqlalchemy.engine import Connection, Engine

from monitor.proxy.routing import follow_store, served
from monitor.store.rollouts import Rollout, active_rollouts

if TYPE_CHECKING:
    from decoder.speculation.speculative import SpeculativeDecoder

log = logging.getLogger(__name__)

DEPLOYMENT: Final = "*"


class RolloutFollower:
    """Takes each read of the deployment's active rollout into ``decoder.staging``, logging what changed."""

    def __init__(self, decoder: SpeculativeDecoder) -> None:
        self.decoder = decoder
        self.seen: Rollout | None = None

    def take(self, rollout: Rollout | None) -> None:
        before, self.seen = self.seen, rollout
        if rollout is None or not rollout.of_proxy:
            self.decoder.staging = rollout
            if rollout is None and before is not None:
                log.info("rollout %s: ended, every request goes to the current drafters again", before.id)
            elif rollout is not None and (before is None or served(before) != served(rollout)):
                log.info("rollout %s: %s, the candidate %s (%s) serves %.0f%% of the requests%s", rollout.id,
                         rollout.status, rollout.drafter, self.decoder.candidate_label, 100 * rollout.step_share,
                         "".join(f"; {w}: {side}" for w, side in sorted(rollout.workloads.items())))  # fmt: skip
            return
        self.decoder.staging = None
        if before is None or before.id != rollout.id:
            log.warning("rollout %s of deployment %s is a proxy's (its current drafter %s): this embedded decoder's "
                        "candidate serves nothing by it", rollout.id, rollout.deployment,
                        ", ".join(rollout.current_drafters))  # fmt: skip


def _active(conn: Connection) -> Rollout | None:
    return active_rollouts(conn).get(DEPLOYMENT)


async def follow_rollout(decoder: SpeculativeDecoder, engine: Engine, every_s: float) -> None:
    """Keep ``decoder.staging`` to the active rollout of the embedded decoder's deployment."""
    await follow_store(engine, every_s, _active, RolloutFollower(decoder).take, "the embedded decoder's rollout")
