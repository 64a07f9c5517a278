"""Which LiteLLM deployment serves a request, and how its record is declared; no LiteLLM import.

The pair is the same model served twice, named in ``litellm.deployments`` as ``spec=plain``. A
request for the speculative name is sent, as the sidecar's proxy does (monitor/proxy/routing.py):

* to the plain deployment when the holdout policy (:mod:`decoder.holdout`) draws it as the
  baseline, so that draftwatch's net-loss test keeps a measured comparison;
* to the plain deployment when draftwatch routed its workload to plain (``routed`` in
  ``GET /v1/routes``), except a probe share the same policy draws, which stays speculative so
  the speedup is still measured and the workload can come back;
* to the candidate deployment (``litellm.candidates``, ``spec=candidate``: the same target with a
  new drafter) for the share of what stays speculative that the default deployment's active
  rollout gives it (``GET /v1/rollouts``; per workload where it kept or promoted one). Only a
  proxy's rollout, whose current side is the ``upstream`` pool: an embedded decoder's rollout
  (its current drafters ``model`` and ``ngram``) is on the same default deployment, and is its own.

Its record is ``holdout`` when it was sent to plain that way, ``speculative`` when the speculative
deployment answered (0 drafts if it drafted nothing: the deployment paid for speculation, issue 36)
or the candidate did, and ``plain`` when a client asked for the plain deployment by name. The
candidate's records carry the rollout's drafter name and the speculative deployment's the current
drafter's (``upstream``, as the proxy names its speculative pool), so that the rollout's judge
compares them.

>>> from monitor.gateways.litellm_settings import load_settings
>>> gate = Gate(load_settings({"DRAFTWATCH_LITELLM_URL": "http://d", "DRAFTWATCH_LITELLM_DEPLOYMENTS": "m=m-plain",
...                            "DRAFTWATCH_LITELLM_HOLDOUT_TARGET": "0", "DRAFTWATCH_LITELLM_HOLDOUT_SHARE": "0.5",
...                            "DRAFTWATCH_LITELLM_CANDIDATES": "m=m-next"}))
>>> sorted(gate.choose("m", "chat")[0] for _ in range(10))   # half of them to the baseline
['m', 'm', 'm', 'm', 'm', 'm-plain', 'm-plain', 'm-plain', 'm-plain', 'm-plain']
>>> gate.choose("other", "chat"), gate.declared("m-plain", "route", None), gate.declared("m-plain", None, None)
(('other', None, None), ('holdout', None), ('plain', None))
>>> gate.routed = frozenset({"batch"})   # routed to plain: all but the probe share (here 0.5) go there
>>> sorted(gate.choose("m", "batch") for _ in range(4))
[('m', None, None), ('m', None, None), ('m-plain', 'route', None), ('m-plain', 'route', None)]
>>> gate.rollout = Staged.from_json({"id": 7, "deployment": "*", "drafter": "ngram-16", "status": "promoted",
...                                  "share": 1.0, "per_workload": False, "workloads": {"qa": "current"}})
>>> sorted({gate.choose("m", "chat") for _ in range(4)}), sorted({gate.choose("m", "qa")[0] for _ in range(4)})
([('m-next', None, 'ngram-16'), ('m-plain', 'share', None)], ['m', 'm-plain'])
>>> gate.declared("m-next", None, "ngram-16"), gate.declared("m-next", None, None), gate.declared("m", None, None)
(('speculative', 'ngram-16'), None, ('speculative', 'upstream'))
>>> gate.workload({"x-workload": "qa"}, {"workload": "meta"}), gate.workload({"x-workload": "no spaces"}, {})
('qa', 'default')
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from decoder.holdout import BaselineDraw, HoldoutReason, process_seed
from decoder.record import WORKLOAD_PATTERN, Mode
from monitor.gateways.litellm_link import Outage
from monitor.gateways.litellm_settings import LitellmSettings

log = logging.getLogger(__name__)

# monitor.store.rollouts' names, spelled out here: the store's module needs SQLAlchemy, which LiteLLM's environment
# does not have (tests/gateways/test_litellm_gate.py holds them equal).
CURRENT_DRAFTER: Final = "upstream"
DEFAULT_DEPLOYMENT: Final = "*"
ACTIVE: Final = ("running", "promoted")


@dataclass(frozen=True, slots=True)
class Staged:
    """The default deployment's active rollout as ``GET /v1/rollouts`` shows it: what decides where requests go."""

    id: int
    drafter: str
    status: str
    step_share: float
    per_workload: bool
    workloads: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, rollout: Mapping[str, Any]) -> Staged:
        workloads = rollout["workloads"]
        if not isinstance(workloads, dict):
            raise TypeError(f"a rollout's workloads: expected an object, got {type(workloads).__name__}")
        return cls(int(rollout["id"]), str(rollout["drafter"]), str(rollout["status"]), float(rollout["share"]),
                   bool(rollout["per_workload"]), {str(w): str(side) for w, side in workloads.items()})  # fmt: skip

    def share(self, workload: str) -> float:
        """The share of ``workload``'s speculative requests the candidate serves, as ``Rollout.share`` says."""
        side = self.workloads.get(workload)
        if side is not None:
            return 1.0 if side == "candidate" and self.status in ACTIVE else 0.0
        if self.status == "promoted" and self.per_workload:
            return 0.0
        return self.step_share


class Gate:
    """The route choice (:meth:`choose`), the record's declaration (:meth:`declared`), the workloads routed to plain
    and the active rollout."""

    def __init__(self, settings: LitellmSettings, seed: int | None = None) -> None:
        self.settings = settings
        self.plain_of = dict(settings.deployments)
        self.plain = frozenset(self.plain_of.values())
        self.candidate_of = dict(settings.candidates)
        self.candidates = frozenset(self.candidate_of.values())
        seed = process_seed(seed)
        self._draw = BaselineDraw(settings.policy, seed=seed)
        self._candidate_draw = random.Random(seed + 2)
        # Replaced whole by the refresh task; the last known decisions stay while draftwatch is away.
        self.routed: frozenset[str] = frozenset()
        self.rollout: Staged | None = None

    def workload(self, headers: Mapping[str, Any], metadata: Mapping[str, Any]) -> str:
        """The header's workload (headers keyed lower-case, as LiteLLM passes them), else metadata's, else the default.

        A name draftwatch would refuse falls to the default rather than losing the request's record.
        """
        for value in (headers.get(self.settings.workload_header.lower()), metadata.get("workload")):
            if isinstance(value, str) and WORKLOAD_PATTERN.match(value):
                return value
        return self.settings.default_workload

    def choose(self, model: str, workload: str) -> tuple[str, HoldoutReason | None, str | None]:
        """The model name to call; when it is the plain deployment instead of ``model``, why; when it is the
        candidate, the rollout's drafter."""
        plain = self.plain_of.get(model)
        if plain is None:
            return model, None, None
        reason = self._draw.draw(workload, workload in self.routed)
        if reason is not None:
            return plain, reason, None
        candidate, rollout = self.candidate_of.get(model), self.rollout
        if candidate and rollout is not None and self._candidate_draw.random() < rollout.share(workload):
            return candidate, None, rollout.drafter
        return model, None, None

    def declared(
        self, model_group: str, diverted: HoldoutReason | None, drafter: str | None
    ) -> tuple[Mode, str | None] | None:
        """The mode and drafter a response of ``model_group`` is reported with (a plain one names none); None for a
        model outside the pairs, and for a candidate's answer that no rollout sent there (its drafter has no name)."""
        if model_group in self.candidates:
            return ("speculative", drafter) if drafter else None
        if model_group in self.plain:
            return "holdout" if diverted is not None else "plain", None
        return ("speculative", CURRENT_DRAFTER) if model_group in self.plain_of else None

    async def refresh(self, client: httpx.AsyncClient, every_s: float) -> None:
        """Keep :attr:`routed` and :attr:`rollout` to draftwatch's decisions (``GET /v1/routes``, and
        ``GET /v1/rollouts`` where a candidate is declared); while it is away the last ones stay."""
        outage = Outage("reading routing decisions", log)
        while True:
            try:
                routed = await self._routed(client)
                rollout = await self._rollout(client) if self.candidates else None
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
                outage.failed(error)
            else:
                outage.ok()
                if routed != self.routed:
                    log.info("draftwatch: workloads sent to the plain deployment now: %s",
                             ", ".join(sorted(routed)) or "none")  # fmt: skip
                if rollout != self.rollout:
                    _log_rollout(rollout)
                self.routed, self.rollout = routed, rollout
            await asyncio.sleep(every_s)

    @staticmethod
    async def _routed(client: httpx.AsyncClient) -> frozenset[str]:
        response = await client.get("/v1/routes")
        response.raise_for_status()
        # Routed by load (above_inflight): plain only while the speculative replica is busy, which the gate cannot
        # see; it stays on the speculative deployment, whose sidecar routes it by load.
        routes = response.json()["routes"]
        return frozenset(r["workload"] for r in routes if r["routed"] and r.get("above_inflight") is None)

    @staticmethod
    async def _rollout(client: httpx.AsyncClient) -> Staged | None:
        """The default deployment's newest running or promoted rollout, where it is a proxy's."""
        response = await client.get("/v1/rollouts", params=[("status", status) for status in ACTIVE])
        response.raise_for_status()
        for rollout in response.json()["rollouts"]:  # newest first
            if rollout["deployment"] == DEFAULT_DEPLOYMENT and rollout["status"] in ACTIVE:
                return Staged.from_json(rollout) if of_proxy(rollout) else None
        return None


def of_proxy(rollout: Mapping[str, Any]) -> bool:
    """Is a rollout of ``GET /v1/rollouts`` a proxy's (``Rollout.of_proxy``), whose share a gateway splits?

    The embedded decoder's rollout, on the same default deployment, sends its share to its own candidate drafter
    and judges it against its portfolio's requests: a gateway that took it for its own would send requests to a
    candidate deployment no rollout was started for, and report them under the drafter name that rollout's judge
    reads as its candidate's. A draftwatch from before ``current_drafters`` was kept knew only a proxy's.
    """
    return list(rollout.get("current_drafters", [CURRENT_DRAFTER])) == [CURRENT_DRAFTER]


def _log_rollout(rollout: Staged | None) -> None:
    if rollout is None:
        log.info("draftwatch: no rollout is active: every speculative request goes to the current drafter")
        return
    kept = "".join(f"; {w}: {side}" for w, side in sorted(rollout.workloads.items()))
    log.info("draftwatch: rollout %s %s, the candidate %s serves %.0f%% of the speculative requests%s", rollout.id,
             rollout.status, rollout.drafter, 100 * rollout.step_share, kept)  # fmt: skip
