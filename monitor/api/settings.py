"""The API's settings: where it listens, who may call it, its limits, the decoder worker's holdout and candidate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from decoder.candidate import Candidate, parse_candidate
from monitor.settings.fields import setting
from monitor.settings.parsers import parse_int, parse_seconds, parse_share, parse_str

# proxy: the pass-through routes of proxy mode, once any token has it (see monitor/proxy/forward/).
API_SCOPES: Final = ("ingest", "read", "admin", "proxy")
API_TOKEN_MIN_LENGTH: Final = 16


class ApiToken(NamedTuple):
    """One bearer token of the sidecar API and its scope; the repr never shows the token."""

    scope: str
    token: str

    def __repr__(self) -> str:
        return f"ApiToken(scope={self.scope!r}, token='***')"


def parse_api_tokens(raw: Any) -> tuple[ApiToken, ...]:
    """``ingest:TOKEN,admin:TOKEN`` (comma-separated ``scope:token`` pairs); the message never quotes a token."""
    if not isinstance(raw, str):
        raise ValueError("expected comma-separated scope:token pairs")
    tokens: list[ApiToken] = []
    for number, part in enumerate(filter(None, (p.strip() for p in raw.split(","))), start=1):
        scope, _, token = part.partition(":")
        if scope.strip() not in API_SCOPES:
            raise ValueError(f"pair {number}: scope must be one of {', '.join(API_SCOPES)}")
        if len(token.strip()) < API_TOKEN_MIN_LENGTH or any(c.isspace() for c in token.strip()):
            raise ValueError(f"pair {number}: token must be at least {API_TOKEN_MIN_LENGTH} characters, no spaces")
        tokens.append(ApiToken(scope.strip(), token.strip()))
    return tuple(tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiSettings:
    host: str = setting(
        "api.host",
        parse_str,
        "127.0.0.1",
        "address `draftwatch serve` binds; anything but loopback needs api.tokens",
    )
    port: int = setting("api.port", parse_int(0, 65535), 8321, "TCP port of `draftwatch serve`")
    tokens: tuple[ApiToken, ...] = setting(
        "api.tokens",
        parse_api_tokens,
        (),
        "bearer tokens of the API as comma-separated scope:token pairs, scopes ingest, read, admin "
        "(admin may do everything), proxy (once given, proxied requests need one in X-Draftwatch-Token); "
        "none configured: no auth, loopback only",
        secret=True,
    )
    max_batch_size: int = setting(
        "api.max_batch_size",
        parse_int(1),
        10_000,
        "most records in one POST /v1/events",
    )
    max_body_bytes: int = setting(
        "api.max_body_bytes",
        parse_int(1024),
        16 * 1024 * 1024,
        "largest request body the API reads, in bytes (default: 16 MiB)",
    )
    request_timeout_s: float = setting(
        "api.request_timeout_s",
        parse_seconds,
        60.0,
        "longest time from a request's arrival to its response's start; 0 disables",
    )
    header_timeout_s: float = setting(
        "api.header_timeout_s",
        parse_seconds,
        10.0,
        "longest time a request's head (request line and headers) may take to arrive, from the connection's "
        "opening or the request's first byte: past it 408 and the connection is closed; 0 disables",
    )
    body_timeout_s: float = setting(
        "api.body_timeout_s",
        parse_seconds,
        30.0,
        "longest pause in a request body's arrival: past it 408 and the connection is closed; 0 disables",
    )
    max_headers: int = setting(
        "api.max_headers",
        parse_int(8),
        100,
        "most header fields in a request: past it 431 and the connection is closed",
    )
    max_header_bytes: int = setting(
        "api.max_header_bytes",
        parse_int(1024),
        64 * 1024,
        "largest request head (target and header fields), in bytes: past it 431 and the connection is closed "
        "(default: 64 KiB)",
    )
    max_body_bytes_in_flight: int = setting(
        "api.max_body_bytes_in_flight",
        parse_int(1024),
        512 * 1024 * 1024,
        "most request body bytes held at once, over all requests until each is answered: past it 503 with "
        "Retry-After (a body alone is never refused by it) (default: 512 MiB)",
    )
    drain_delay_s: float = setting(
        "api.drain_delay_s",
        parse_seconds,
        0.0,
        "on SIGTERM, how long the server keeps taking requests while /readyz answers 503 (so a load balancer "
        "takes it out) before it stops accepting",
    )
    shutdown_timeout_s: float = setting(
        "api.shutdown_timeout_s",
        parse_seconds,
        20.0,
        "after api.drain_delay_s, how long the requests and streams still open may run before they are ended "
        "and recorded as cut (below the pod's terminationGracePeriodSeconds)",
    )
    decode_queue_size: int = setting(
        "api.decode_queue_size",
        parse_int(1),
        16,
        "generation requests waiting for the decoder; beyond that the API answers 503",
    )

    @property
    def url(self) -> str:
        """Where the API is reached, for links in notifications."""
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class DecoderSettings:
    """The holdout of the sidecar's decoder worker (the decoder itself takes a plain HoldoutPolicy), its candidate."""

    holdout_share: float = setting(
        "decoder.holdout_share",
        parse_share,
        0.05,
        "share of a workload's requests decoded without speculation (mode holdout) to measure the speedup, once it "
        "has decoder.holdout_target of them in the last drift.current_window",
        renamed_from=("DRAFTWATCH_HOLDOUT_SHARE",),
    )
    holdout_target: int = setting(
        "decoder.holdout_target",
        parse_int(0),
        30,
        "holdout requests per workload and drift.current_window that the measured net-loss test needs; below it a "
        "workload's requests are held out at decoder.holdout_max_share (as drift.min_requests; 0: off)",
        renamed_from=("DRAFTWATCH_HOLDOUT_TARGET",),
    )
    holdout_max_share: float = setting(
        "decoder.holdout_max_share",
        parse_share,
        0.2,
        "share held out while a workload is below decoder.holdout_target: the most a small workload pays for "
        "measuring its speedup",
        renamed_from=("DRAFTWATCH_HOLDOUT_MAX_SHARE",),
    )
    candidate: Candidate | None = setting(
        "decoder.candidate",
        parse_candidate,
        None,
        "the embedded decoder's candidate drafter, which a rollout (draftwatch rollout start) gives a share of the "
        "requests beside the current drafters: ngram:MIN-MAX (prompt lookup of MIN- to MAX-grams) or model:MODEL "
        "(a draft model, as --draft); serve --candidate-drafter and --candidate-draft set it",
    )
