"""The draftwatch callback the LiteLLM proxy loads from its config: ``litellm_settings: callbacks:
["monitor.gateways.litellm_callback.handler"]``, configured by ``DRAFTWATCH_LITELLM_*`` in its environment.

The one module that imports LiteLLM (installed in the proxy's environment, not draftwatch's): its
hooks hand over to :mod:`~monitor.gateways.litellm_gate` (which deployment, which mode) and
:mod:`~monitor.gateways.litellm_report` (the adapter's body, the queue). Neither hook can fail a
request: draftwatch away, a response it cannot read, a bug here, the request goes on as it came.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from monitor.gateways.litellm_gate import Gate
from monitor.gateways.litellm_link import client
from monitor.gateways.litellm_report import Reporter, report_body
from monitor.gateways.litellm_settings import load_settings
from monitor.log_safe import describe
from monitor.settings.parsers import ConfigError

log = logging.getLogger(__name__)
# What the pre-call hook leaves in the request's metadata for the success hook: the workload, and why it was diverted.
MARK = "draftwatch"


class DraftwatchLogger(CustomLogger):
    """Routes in the pre-call hook, reports in the success hook; with settings that do not parse, does neither.

    A bad setting is logged once, as one line, and the gateway serves on without draftwatch: the
    monitor's configuration is no reason to refuse the users' requests.
    """

    def __init__(self, environ: Mapping[str, str]) -> None:
        super().__init__()
        self._tasks: list[asyncio.Task[None]] = []
        self._streams_skipped = False
        try:
            self.settings = load_settings(environ)
        except ConfigError as error:
            log.error("draftwatch LiteLLM integration off: %s", error)
            self.enabled = False
            return
        self.enabled = True
        self.gate = Gate(self.settings)
        self.reporter = Reporter(self.settings.stack, self.settings.queue_size)

    def _start(self) -> None:
        # LiteLLM builds the callback before its event loop runs: the tasks start with the first request.
        if not self._tasks:
            http = client(self.settings)
            self._tasks = [asyncio.create_task(self.gate.refresh(http, self.settings.refresh_s)),
                           asyncio.create_task(self.reporter.run(http))]  # fmt: skip

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any]:
        if not self.enabled:
            return data
        try:
            self._start()
            metadata = data.get("metadata")
            model = data.get("model")
            if not isinstance(metadata, dict) or not isinstance(model, str):
                return data
            headers = (data.get("proxy_server_request") or {}).get("headers") or {}
            workload = self.gate.workload(headers, metadata)
            data["model"], diverted, drafter = self.gate.choose(model, workload)
            metadata[MARK] = {"workload": workload, "diverted": diverted, "drafter": drafter}
        except Exception as error:  # never the user's request's failure
            log.error("draftwatch pre-call hook failed (%s): the request goes on unrouted", describe(error))
        return data

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: datetime, end_time: datetime
    ) -> None:
        if not self.enabled:
            return
        try:
            metadata = (kwargs.get("litellm_params") or {}).get("metadata") or {}
            mark = metadata.get(MARK) or {}
            group = (kwargs.get("standard_logging_object") or {}).get("model_group") or metadata.get("model_group")
            declared = (self.gate.declared(group, mark.get("diverted"), mark.get("drafter"))
                        if isinstance(group, str) else None)  # fmt: skip
            if declared is not None and kwargs.get("stream"):
                self._skip_stream()
                return
            response = _provider_response(kwargs.get("original_response"), response_obj)
            if declared is None or response is None:
                return
            mode, drafter = declared
            workload = mark.get("workload") or self.gate.workload(metadata.get("headers") or {}, metadata)
            self.reporter.offer(report_body(response, workload=workload, mode=mode, drafter=drafter,
                                            started=start_time.timestamp(), ended=end_time.timestamp()))  # fmt: skip
        except Exception as error:
            log.error("draftwatch success hook failed (%s): this response is not reported", describe(error))

    def _skip_stream(self) -> None:
        if not self._streams_skipped:
            self._streams_skipped = True
            log.warning("draftwatch: streamed responses are not reported (logged once): LiteLLM's stream chunks drop "
                        "the stack's per-request figures (llama.cpp's timings); they are still routed")  # fmt: skip


def _provider_response(original: Any, response_obj: Any) -> dict[str, Any] | None:
    """The stack's JSON object as it answered: LiteLLM's copy of the raw body, else its own response object."""
    if isinstance(original, str):
        try:
            parsed = json.loads(original)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    dumped = response_obj.model_dump() if hasattr(response_obj, "model_dump") else None
    return dumped if isinstance(dumped, dict) else None


handler = DraftwatchLogger(os.environ)
