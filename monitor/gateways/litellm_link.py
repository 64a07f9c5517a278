"""The LiteLLM integration's link to draftwatch: one HTTP client, and an outage logged once, not per request.

>>> import logging
>>> outage = Outage("reading routing decisions", logging.getLogger("doctest"))
>>> outage.failed(TimeoutError()), outage.failed(TimeoutError()), outage.ok()
(True, False, True)
"""

from __future__ import annotations

import logging

import httpx

from monitor.gateways.litellm_settings import LitellmSettings
from monitor.log_safe import describe


def client(settings: LitellmSettings) -> httpx.AsyncClient:
    """draftwatch's API at ``litellm.url``, every call bounded by ``litellm.timeout_s``, with the token if set."""
    headers = {"Authorization": f"Bearer {settings.token}"} if settings.token else {}
    return httpx.AsyncClient(base_url=settings.url, headers=headers, timeout=settings.timeout_s)


class Outage:
    """Whether draftwatch answers ``what``; logs the first failure and the recovery, and counts what was lost between.

    Each returns whether it logged. The errors are described by kind only: an HTTP error's text would carry the URL's
    query or a body.
    """

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self.log = log
        self.down = False
        self.lost = 0

    def failed(self, error: BaseException | str, lost: int = 0) -> bool:
        self.lost += lost
        if self.down:
            return False
        self.down = True
        why = error if isinstance(error, str) else describe(error)
        self.log.warning("draftwatch unreachable %s (%s): requests go on unchanged; logged once until it is back",
                         self.what, why)  # fmt: skip
        return True

    def ok(self) -> bool:
        if not self.down:
            return False
        self.log.warning(
            "draftwatch reachable again %s%s", self.what, f" ({self.lost} lost meanwhile)" if self.lost else ""
        )
        self.down, self.lost = False, 0
        return True
