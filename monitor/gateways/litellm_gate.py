"""Which LiteLLM deployment serves a request, and how its record is declared; no LiteLLM import.

The pair is the same model served twice, named in ``litellm.deployments`` as ``spec=plain``. A
request for the speculative name is sent, as the sidecar's proxy does (monitor/proxy/routing.py):

* to the plain deployment when the holdout policy (:mod:`decoder.holdout`) draws it as the
  baseline, so that draftwatch's net-loss test keeps a measured comparison;
* to the plain deployment when draftwatch routed its workload to plain (``routed`` in
  ``GET /v1/routes``), except a probe share the same policy draws, which stays speculative so
  the speedup is still measured and the workload can come back.

Its record is ``holdout`` when it was sent to plain that way, ``speculative`` when the speculative
deployment answered (0 drafts if it drafted nothing: the deployment paid for speculation, issue 36),
and ``plain`` when a client asked for the plain deployment by name.

>>> from monitor.gateways.litellm_settings import load_settings
>>> gate = Gate(load_settings({"DRAFTWATCH_LITELLM_URL": "http://d", "DRAFTWATCH_LITELLM_DEPLOYMENTS": "m=m-plain",
...                            "DRAFTWATCH_LITELLM_HOLDOUT_TARGET": "0", "DRAFTWATCH_LITELLM_HOLDOUT_SHARE": "0.5"}))
>>> sorted(gate.choose("m", "chat")[0] for _ in range(10))   # half of them to the baseline
['m', 'm', 'm', 'm', 'm', 'm-plain', 'm-plain', 'm-plain', 'm-plain', 'm-plain']
>>> gate.choose("other", "chat"), gate.mode_of("m-plain", "route"), gate.mode_of("m-plain", None)
(('other', None), 'holdout', 'plain')
>>> gate.routed = frozenset({"batch"})   # routed to plain: all but the probe share (here 0.5) go there
>>> sorted(gate.choose("m", "batch") for _ in range(4))
[('m', None), ('m', None), ('m-plain', 'route'), ('m-plain', 'route')]
>>> gate.workload({"x-workload": "qa"}, {"workload": "meta"}), gate.workload({"x-workload": "no spaces"}, {})
('qa', 'default')
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from decoder.holdout import BaselineDraw, HoldoutReason
from decoder.record import WORKLOAD_PATTERN, Mode
from monitor.gateways.litellm_link import Outage
from monitor.gateways.litellm_settings import LitellmSettings

log = logging.getLogger(__name__)


class Gate:
    """The route choice (:meth:`choose`), the record's mode (:meth:`mode_of`) and the workloads routed to plain."""

    def __init__(self, settings: LitellmSettings, seed: int = 0) -> None:
        self.settings = settings
        self.plain_of = dict(settings.deployments)
        self.plain = frozenset(self.plain_of.values())
        self._draw = BaselineDraw(settings.policy, seed=seed)
        # Replaced whole by the refresh task; the last known decisions stay while draftwatch is away.
        self.routed: frozenset[str] = frozenset()

    def workload(self, headers: Mapping[str, Any], metadata: Mapping[str, Any]) -> str:
        """The header's workload (headers keyed lower-case, as LiteLLM passes them), else metadata's, else the default.

        A name draftwatch would refuse falls to the default rather than losing the request's record.
        """
        for value in (headers.get(self.settings.workload_header.lower()), metadata.get("workload")):
            if isinstance(value, str) and WORKLOAD_PATTERN.match(value):
                return value
        return self.settings.default_workload

    def choose(self, model: str, workload: str) -> tuple[str, HoldoutReason | None]:
        """The model name to call and, when it is the plain deployment instead of ``model``, why."""
        plain = self.plain_of.get(model)
        if plain is None:
            return model, None
        reason = self._draw.draw(workload, workload in self.routed)
        return (plain, reason) if reason is not None else (model, None)

    def mode_of(self, model_group: str, diverted: HoldoutReason | None) -> Mode | None:
        """How a response of ``model_group`` is declared; None for a model outside the pairs (not reported)."""
        if model_group in self.plain:
            return "holdout" if diverted is not None else "plain"
        return "speculative" if model_group in self.plain_of else None

    async def refresh(self, client: httpx.AsyncClient, every_s: float) -> None:
        """Keep :attr:`routed` to draftwatch's decisions (``GET /v1/routes``); while it is away the last ones stay."""
        outage = Outage("reading routing decisions", log)
        while True:
            try:
                response = await client.get("/v1/routes")
                response.raise_for_status()
                routed = frozenset(r["workload"] for r in response.json()["routes"] if r["routed"])
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
                outage.failed(error)
            else:
                outage.ok()
                if routed != self.routed:
                    log.info("draftwatch: workloads sent to the plain deployment now: %s",
                             ", ".join(sorted(routed)) or "none")  # fmt: skip
                self.routed = routed
            await asyncio.sleep(every_s)
