"""A LiteLLM response as the body of draftwatch's adapter ``POST /v1/events/{stack}``, posted off the response path.

The body is the stack's own response as LiteLLM received it (llama.cpp's ``timings``, vLLM's
``metrics``, SGLang's ``meta_info``) with the caller's fields that the adapter takes (docs/api.md):
the workload, the declared mode (with ``speculative``, so a speculative answer that drafted nothing
is stored speculative with 0 drafts), the drafter where one is known (the current drafter's name on
a speculative answer, the rollout's on the candidate's) and the gateway's clock. Generated text
never leaves the gateway: it is cut out before the body is queued.

>>> answer = {"id": "c1", "model": "m", "timings": {"draft_n": 4, "draft_n_accepted": 3},
...           "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "secret"}}]}
>>> body = report_body(answer, workload="chat", mode="holdout", drafter=None, started=0.0, ended=1.5)
>>> body["choices"], body["speculative"], body["mode"], "drafter" in body, body["ts_end"]
([{'index': 0, 'finish_reason': 'stop'}], False, 'holdout', False, '1970-01-01T00:00:01.500000+00:00')
>>> report_body(answer, workload="chat", mode="speculative", drafter="upstream", started=0.0, ended=1.5)["drafter"]
'upstream'
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any, Final

import httpx

from decoder.record import Mode
from monitor.gateways.litellm_link import Outage

log = logging.getLogger(__name__)

# Where a response carries text: a choice's message, text, delta and logprobs; SGLang's top-level text.
_TEXT_OF_CHOICE: Final = ("message", "text", "delta", "logprobs")
_TEXT: Final = ("text", "output", "prompt_logprobs")
MAX_REFUSALS_LOGGED: Final = 20


def report_body(
    response: dict[str, Any], *, workload: str, mode: Mode, drafter: str | None, started: float, ended: float
) -> dict[str, Any]:
    """The adapter's body for ``response`` (the provider's JSON object); ``started``/``ended`` are epoch seconds."""
    body = {key: value for key, value in response.items() if key not in _TEXT}
    choices = response.get("choices")
    if isinstance(choices, list):
        body["choices"] = [
            {k: v for k, v in choice.items() if k not in _TEXT_OF_CHOICE} if isinstance(choice, dict) else choice
            for choice in choices
        ]
    return {
        **body,
        "workload": workload,
        "mode": mode,
        "speculative": mode == "speculative",
        "ts_start": datetime.fromtimestamp(started, UTC).isoformat(),
        "ts_end": datetime.fromtimestamp(ended, UTC).isoformat(),
    } | ({"drafter": drafter} if drafter else {})


class Reporter:
    """A bounded queue of bodies and the task that posts them one by one; :meth:`offer` never waits.

    A full queue drops the new body (the response is already the user's), and draftwatch away loses
    the bodies posted meanwhile: both counted, and logged once per outage.

    >>> reporter = Reporter("llamacpp", size=1)
    >>> reporter.offer({"workload": "a"}), reporter.offer({"workload": "b"})
    (None, None)
    >>> reporter.queue.qsize(), reporter.outage.lost, reporter.outage.down
    (1, 1, True)
    """

    def __init__(self, stack: str, size: int) -> None:
        self.path = f"/v1/events/{stack}"
        self.queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(size)
        self.outage = Outage(f"posting reports to {self.path}", log)
        self.refused: set[str] = set()

    def offer(self, body: dict[str, Any], path: str | None = None) -> None:
        """Queue ``body`` for the adapter (``path`` None) or another ingest path (a record: ``/v1/events``)."""
        try:
            self.queue.put_nowait((path or self.path, body))
        except asyncio.QueueFull:
            self.outage.failed("the report queue is full: litellm.queue_size", lost=1)

    async def run(self, client: httpx.AsyncClient) -> None:
        while True:
            path, body = await self.queue.get()
            try:
                response = await client.post(path, json=body)
            except httpx.HTTPError as error:
                self.outage.failed(error, lost=1)
                continue
            if response.status_code == 422:
                # draftwatch refused this response (a stack it cannot read): the record is lost, not the link. Each
                # kind of refusal is logged once: a misread stack would otherwise log every request.
                problems = _problems(response)
                if problems not in self.refused and len(self.refused) < MAX_REFUSALS_LOGGED:
                    self.refused.add(problems)
                    log.warning("draftwatch refused a report (logged once per kind): %s", problems)
            elif response.is_error:
                self.outage.failed(f"HTTP {response.status_code}", lost=1)
            else:
                self.outage.ok()


def _problems(response: httpx.Response) -> str:
    """Where and why draftwatch refused a body: its problems' locations and messages, never the values."""
    try:
        problems = response.json()["detail"]
        return "; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in problems[:5])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}"
