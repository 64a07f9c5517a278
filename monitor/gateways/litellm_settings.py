"""The LiteLLM integration's settings, read from the LiteLLM proxy's environment (``DRAFTWATCH_LITELLM_*``).

The integration runs inside the LiteLLM proxy's process, not draftwatch's, so it has a section of its
own rather than a place in ``draftwatch.toml``: its holdout is the one the sidecar's proxy applies
(``decoder.holdout_*``) set again here, since the sidecar does not publish it.

>>> s = load_settings({"DRAFTWATCH_LITELLM_URL": "http://draftwatch:8000/",
...                    "DRAFTWATCH_LITELLM_DEPLOYMENTS": "a=a-plain"})
>>> s.url, s.deployments, s.policy.max_share
('http://draftwatch:8000', (('a', 'a-plain'),), 0.2)
>>> load_settings({"DRAFTWATCH_LITELLM_URL": "http://d", "DRAFTWATCH_LITELLM_DEPLOYMENTS": "a"})
Traceback (most recent call last):
...
monitor.settings.parsers.ConfigError: DRAFTWATCH_LITELLM_DEPLOYMENTS='a': expected SPECULATIVE=PLAIN model names, \
comma-separated, e.g. llama=llama-plain
>>> load_settings({"DRAFTWATCH_LITELLM_URL": "http://d", "DRAFTWATCH_LITELLM_DEPLOYMENTS": "a=a-plain",
...                "DRAFTWATCH_LITELLM_CANDIDATES": "b=b-next"})
Traceback (most recent call last):
...
monitor.settings.parsers.ConfigError: DRAFTWATCH_LITELLM_CANDIDATES: b=b-next: expected the speculative name of a pair \
in DRAFTWATCH_LITELLM_DEPLOYMENTS (a) and a candidate name of its own
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

from decoder.holdout import HoldoutPolicy
from monitor.settings.fields import resolve, setting, specs
from monitor.settings.parsers import (
    ConfigError,
    parse_choice,
    parse_duration,
    parse_int,
    parse_seconds,
    parse_share,
    parse_str,
)

STACKS: Final = ("llamacpp", "vllm", "sglang")
_REQUIRED: Final = ("url", "deployments")


def parse_url(raw: Any) -> str:
    url = parse_str(raw).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError("expected draftwatch's base URL, e.g. http://draftwatch:8000")
    return url


def parse_deployments(raw: Any) -> tuple[tuple[str, str], ...]:
    """``spec=plain`` pairs of LiteLLM model names (``model_name`` in its config), comma-separated.

    >>> parse_deployments("llama=llama-plain, qwen = qwen-plain")
    (('llama', 'llama-plain'), ('qwen', 'qwen-plain'))
    """
    return _pairs(raw, "PLAIN", "llama=llama-plain")


def parse_candidates(raw: Any) -> tuple[tuple[str, str], ...]:
    """``spec=candidate`` pairs: a speculative deployment and the same target served with the new drafter.

    >>> parse_candidates("llama=llama-eagle3-v2")
    (('llama', 'llama-eagle3-v2'),)
    """
    return _pairs(raw, "CANDIDATE", "llama=llama-eagle3-v2")


def _pairs(raw: Any, right: str, example: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in parse_str(raw).split(","):
        speculative, sep, other = (part.strip() for part in item.partition("="))
        if not (sep and speculative and other) or speculative == other:
            raise ValueError(f"expected SPECULATIVE={right} model names, comma-separated, e.g. {example}")
        pairs.append((speculative, other))
    return tuple(pairs)


@dataclass(frozen=True, slots=True, kw_only=True)
class LitellmSettings:
    """Where draftwatch is, which LiteLLM deployments are the speculative and plain pair, and the holdout."""

    url: str = setting("litellm.url", parse_url, "", "draftwatch's base URL as the LiteLLM proxy reaches it (required)")
    token: str = setting(
        "litellm.token",
        parse_str,
        "",
        "bearer token for draftwatch's API with scopes ingest and read (none: its API is open)",
        secret=True,
    )
    deployments: tuple[tuple[str, str], ...] = setting(
        "litellm.deployments",
        parse_deployments,
        (),
        "LiteLLM model names, SPECULATIVE=PLAIN, comma-separated: the same model served with and without "
        "speculation (required)",
    )
    candidates: tuple[tuple[str, str], ...] = setting(
        "litellm.candidates",
        parse_candidates,
        (),
        "LiteLLM model names, SPECULATIVE=CANDIDATE, comma-separated: the same target served with a new drafter, "
        "which a running or promoted draftwatch rollout of the default deployment gives its share of the "
        "speculative deployment's requests, reported under the rollout's drafter name",
    )
    stack: str = setting(
        "litellm.stack",
        parse_choice(STACKS),
        "llamacpp",
        "the serving stack behind the deployments, whose response carries the speculative figures",
    )
    workload_header: str = setting(
        "litellm.workload_header", parse_str, "X-Workload", "request header naming a request's workload"
    )
    default_workload: str = setting(
        "litellm.default_workload",
        parse_str,
        "default",
        "workload of a request without the header or metadata.workload",
    )
    holdout_share: float = setting(
        "litellm.holdout_share",
        parse_share,
        0.05,
        "share of a workload's requests sent to the plain deployment as the baseline, once it has "
        "litellm.holdout_target of them in litellm.holdout_window (as the sidecar's decoder.holdout_share)",
    )
    holdout_target: int = setting(
        "litellm.holdout_target",
        parse_int(0),
        30,
        "baseline requests per workload and window that the net-loss test needs (as drift.min_requests)",
    )
    holdout_max_share: float = setting(
        "litellm.holdout_max_share",
        parse_share,
        0.2,
        "share sent to the plain deployment while a workload is below litellm.holdout_target",
    )
    holdout_window: timedelta = setting(
        "litellm.holdout_window", parse_duration, timedelta(hours=1), "as draftwatch's drift.current_window"
    )
    refresh_s: float = setting(
        "litellm.refresh_s", parse_seconds, 10.0, "how often draftwatch's routing decisions are read"
    )
    timeout_s: float = setting(
        "litellm.timeout_s", parse_seconds, 2.0, "longest wait for draftwatch on each call, read or report"
    )
    queue_size: int = setting(
        "litellm.queue_size",
        parse_int(1),
        10_000,
        "reports waiting to be posted; past it the newest are dropped (counted in the log), never the response",
    )

    @property
    def policy(self) -> HoldoutPolicy:
        return HoldoutPolicy(
            share=self.holdout_share,
            target=self.holdout_target,
            max_share=self.holdout_max_share,
            window_s=self.holdout_window.total_seconds(),
        )


def load_settings(environ: Mapping[str, str]) -> LitellmSettings:
    """The section from ``environ``; raises :class:`ConfigError` naming the variable and what to set."""
    settings = resolve(LitellmSettings, lambda spec: (spec.env, environ[spec.env]) if spec.env in environ else None,
                       Path("."))  # fmt: skip
    named = dict(specs(LitellmSettings))
    for name, spec in named.items():
        if name in _REQUIRED and not getattr(settings, name):
            raise ConfigError(f"{spec.env} is not set: set it in the LiteLLM proxy's environment ({spec.help})")
    paired = dict(settings.deployments)
    taken = set(paired) | set(paired.values())
    for speculative, candidate in settings.candidates:
        if speculative not in paired or candidate in taken:
            raise ConfigError(
                f"{named['candidates'].env}: {speculative}={candidate}: expected the speculative name of a pair in "
                f"{named['deployments'].env} ({', '.join(paired)}) and a candidate name of its own"
            )
    return settings
