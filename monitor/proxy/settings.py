"""Proxy mode's settings: the upstreams, their stacks, how a proxied request's workload is named."""

from __future__ import annotations

import difflib
import ipaddress
import itertools
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, NamedTuple
from urllib.parse import urlsplit

from decoder.record import WORKLOAD_PATTERN
from monitor.settings.fields import setting
from monitor.settings.masking import quoted
from monitor.settings.parsers import (
    parse_bool,
    parse_choice,
    parse_duration,
    parse_fraction,
    parse_int,
    parse_seconds,
    parse_share,
    parse_str,
    parse_tables,
)

PROXY_KINDS: Final = ("auto", "vllm", "sglang", "llamacpp", "openai")
BASELINE_POLICIES: Final = ("share", "member")
RULE_FIELDS: Final = ("model", "path", "user")
ROUTE_KEYS: Final = ("model", "upstream", "kind", "baseline_upstream", "candidate_upstream")


class WorkloadRule(NamedTuple):
    """``field:pattern=workload``: a proxied request whose ``field`` matches ``pattern`` (fnmatch) is ``workload``."""

    field: str
    pattern: str
    workload: str


def parse_upstream(raw: Any) -> str:
    """A base URL to forward to: http(s), a host, a port 1-65535, a path prefix, ``user:password@`` (sent as Basic).

    Everything is checked here, at load, rather than when the proxy first connects: a URL the proxy
    could not reach, or one with a part it would drop (a query, a fragment), is a setting's error.

    >>> parse_upstream("http://ada:s3cret@[::1]:8443/v1/")
    'http://ada:s3cret@[::1]:8443/v1'
    >>> parse_upstream("http://127.0.0.1:99999")
    Traceback (most recent call last):
    ...
    ValueError: port 99999: expected a port 1-65535
    """
    url = parse_str(raw).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// base URL, such as http://127.0.0.1:8080")
    if any(not " " < char < "\x7f" for char in url):
        raise ValueError("expected a URL of printable ASCII, no blanks: percent-encode other characters")
    if "," in url:  # only a list's item can hold one: a string of several is split at its commas first
        raise ValueError("expected one base URL per item, not several joined by ','")
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed "[", or brackets around what is no address
        raise ValueError(_IPV6_EXPECTED) from None
    if "@" in url.removeprefix(f"{parts.scheme}://{parts.netloc}"):
        raise ValueError("expected '@' only to end user:password (percent-encode / ? # @ in a password)")
    if "?" in url or "#" in url:
        raise ValueError("expected no query or fragment: the proxy appends each request's own path and query")
    user_info, at, host_port = parts.netloc.rpartition("@")
    if at and not user_info:
        raise ValueError("expected user:password before '@'")
    _check_host_and_port(host_port)
    return url


_IPV6_EXPECTED: Final = "expected an IPv6 address in brackets, such as http://[::1]:8080"
# A host name (letters, digits, "-", "." and "_" as container names have them) or an IPv4 address.
_HOST_NAME: Final = re.compile(r"[A-Za-z0-9._-]+")


def _check_host_and_port(host_port: str) -> None:
    if host_port.startswith("["):
        address, closed, rest = host_port[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            raise ValueError(_IPV6_EXPECTED)
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            raise ValueError(_IPV6_EXPECTED) from None
        port = rest[1:] if rest else None
    else:
        host, colon, port_text = host_port.partition(":")
        if ":" in port_text:  # an IPv6 address without its brackets
            raise ValueError(_IPV6_EXPECTED)
        if not host:
            raise ValueError("expected a host, such as http://127.0.0.1:8080")
        if not _HOST_NAME.fullmatch(host):
            raise ValueError(f"host {host!r}: expected a host name or an IP address")
        port = port_text if colon else None
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"port {port if port.isdigit() else repr(port)}: expected a port 1-65535")


def parse_upstreams(raw: Any) -> tuple[str, ...]:
    """One base URL or several (a pool): a TOML list, or comma-separated in the environment.

    >>> parse_upstreams("http://a:8080, http://b:8080/")
    ('http://a:8080', 'http://b:8080')
    """
    items = raw if isinstance(raw, list | tuple) else parse_str(raw).split(",")
    urls = tuple(parse_upstream(item) for item in items if not isinstance(item, str) or item.strip())
    if len(set(urls)) != len(urls):
        raise ValueError("expected each base URL once")
    return urls


class ModelRoute(NamedTuple):
    """``[[proxy.routes]]``: requests whose ``model`` matches ``model`` (exact, or an fnmatch glob) go to ``upstream``.

    ``kind`` None is the proxy's own ``proxy.kind``; ``baseline_upstream`` is the route's own plain
    baseline, taken as ``proxy.baseline_policy`` says; ``candidate_upstream`` the same target with a
    new drafter, which a rollout (``draftwatch rollout``) gives a share of the speculative traffic.
    """

    model: str
    upstream: tuple[str, ...]
    kind: str | None = None
    baseline_upstream: tuple[str, ...] = ()
    candidate_upstream: tuple[str, ...] = ()

    def __str__(self) -> str:
        """As ``draftwatch config show`` prints it: ``qwen* -> [http://a:8000 http://b:8000] (vllm)``."""
        kind = self.kind or "proxy.kind"
        baseline = f", baseline [{' '.join(self.baseline_upstream)}]" if self.baseline_upstream else ""
        candidate = f", candidate [{' '.join(self.candidate_upstream)}]" if self.candidate_upstream else ""
        return f"{self.model} -> [{' '.join(self.upstream)}] ({kind}{baseline}{candidate})"


def parse_routes(raw: Any) -> tuple[ModelRoute, ...]:
    """``[[proxy.routes]]`` tables (a JSON list of the same objects in the environment), tried in order.

    >>> parse_routes([{"model": "qwen*", "upstream": ["http://a:8000", "http://b:8000"], "kind": "vllm"}])[0].upstream
    ('http://a:8000', 'http://b:8000')
    >>> parse_routes([{"model": "llama", "upstream": "ftp://a"}])
    Traceback (most recent call last):
    ...
    ValueError: route 1: upstream='ftp://a': expected an http:// or https:// base URL, such as http://127.0.0.1:8080
    """
    routes: list[ModelRoute] = []
    tables = parse_tables(raw, "{model, upstream, kind, baseline_upstream, candidate_upstream} tables")
    for number, entry in enumerate(tables, start=1):
        if not isinstance(entry, dict):
            raise ValueError(f"route {number}: expected a table with model and upstream, got {quoted(entry)}")
        unknown = sorted(set(entry) - set(ROUTE_KEYS))
        if unknown:
            close = difflib.get_close_matches(unknown[0], ROUTE_KEYS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"route {number}: unknown key {unknown[0]!r}{hint}: the keys are {', '.join(ROUTE_KEYS)}")
        for key in ("model", "upstream"):
            if key not in entry:
                raise ValueError(f"route {number}: {key} is missing: each route needs model and upstream")
        model = entry["model"]
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"route {number}: model={quoted(model)}: expected a model name or a glob such as 'qwen*'")
        values: dict[str, Any] = {}
        for key, parse in (("upstream", parse_upstreams), ("baseline_upstream", parse_upstreams),
                           ("candidate_upstream", parse_upstreams), ("kind", parse_choice(PROXY_KINDS))):  # fmt: skip
            if key in entry:
                try:
                    values[key] = parse(entry[key])
                except ValueError as error:
                    raise ValueError(f"route {number}: {key}={quoted(entry[key])}: {error}") from None
        if not values["upstream"]:
            raise ValueError(f"route {number}: upstream=[]: expected at least one base URL")
        routes.append(ModelRoute(model.strip(), **values))
    return tuple(routes)


def parse_workload_rules(raw: Any) -> tuple[WorkloadRule, ...]:
    """``model:qwen*=code;path:/completion=completion;user:bot-*=batch``, tried in order.

    >>> parse_workload_rules("model:qwen*=code; user:bot-*=batch")[1]
    WorkloadRule(field='user', pattern='bot-*', workload='batch')
    """
    if not isinstance(raw, str):
        raise ValueError("expected rules like 'model:qwen*=code;path:/completion=completion'")
    rules: list[WorkloadRule] = []
    for number, part in enumerate(filter(None, (p.strip() for p in raw.split(";"))), start=1):
        match, _, workload = part.rpartition("=")
        field, _, pattern = match.partition(":")
        if field.strip() not in RULE_FIELDS or not pattern.strip() or not WORKLOAD_PATTERN.fullmatch(workload.strip()):
            raise ValueError(
                f"rule {number}: expected FIELD:PATTERN=WORKLOAD with FIELD one of {', '.join(RULE_FIELDS)} "
                "and WORKLOAD a workload tag"
            )
        rules.append(WorkloadRule(field.strip(), pattern.strip(), workload.strip()))
    return tuple(rules)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxySettings:
    """Proxy mode: the sidecar forwards a serving stack's endpoints and records every request it passes."""

    upstream: tuple[str, ...] = setting(
        "proxy.upstream",
        parse_upstreams,
        (),
        "base URLs of the speculative serving stack to forward to (proxy mode), e.g. http://127.0.0.1:8080; several "
        "(a TOML list, or comma-separated) make a pool balanced by least outstanding requests; none: no proxy. A "
        "URL's path is a prefix of every forwarded path; its user:password@ goes to that upstream as HTTP Basic "
        "Authorization unless the client sends an Authorization of its own, and is masked wherever it is shown",
    )
    routes: tuple[ModelRoute, ...] = setting(
        "proxy.routes",
        parse_routes,
        (),
        "upstream pools by the request's model: [[proxy.routes]] tables (model, an exact name or a glob; upstream, "
        "one URL or a list; kind, default proxy.kind; baseline_upstream), first match wins, a JSON list of the same "
        "in the environment; a model no route matches goes to proxy.upstream",
    )
    eject_after: int = setting(
        "proxy.eject_after",
        parse_int(1),
        3,
        "failures in a row (refused, reset, timed out, or answering 502/503/504) after which a replica leaves its "
        "pool for proxy.eject_cooldown_s; with every replica out, the one due back first is still tried, and once "
        "one answers the others are back on trial",
    )
    eject_cooldown_s: float = setting(
        "proxy.eject_cooldown_s",
        parse_seconds,
        30.0,
        "how long a failing replica stays out of its pool; then it is tried again, and one more failure sends it "
        "out again",
    )
    baseline_upstream: tuple[str, ...] = setting(
        "proxy.baseline_upstream",
        parse_upstreams,
        (),
        "base URLs (as proxy.upstream's) of the same model served without speculation: the baseline that measures "
        "whether speculation pays, per workload (see proxy.baseline_policy); none: the speedup is not measured",
    )
    candidate_upstream: tuple[str, ...] = setting(
        "proxy.candidate_upstream",
        parse_upstreams,
        (),
        "base URLs (as proxy.upstream's) of the same target served with a new drafter: the candidate pool a rollout "
        "(draftwatch rollout start) gives a rising share of the speculative traffic, judged against proxy.upstream "
        "per workload; none: no rollout can start on this deployment",
    )
    baseline_policy: str = setting(
        "proxy.baseline_policy",
        parse_choice(BASELINE_POLICIES),
        "share",
        "how requests reach the baseline: share (the holdout policy, decoder.holdout_*, draws them per workload) "
        "or member (the baseline replicas are equal members of the least-outstanding-requests pool: load matched "
        "by construction, recommended where a whole replica can be spared)",
    )
    on_net_loss: str = setting(
        "proxy.on_net_loss",
        parse_choice(("alert", "route")),
        "alert",
        "what an established net loss does: alert only, or route (the workload goes to the baseline, a probe share "
        "drawn by the holdout policy keeps reaching the speculative pool, and it returns once the speedup's lower "
        "bound is above 1 again)",
    )
    route_min_dwell_s: float = setting(
        "proxy.route_min_dwell_s",
        parse_seconds,
        1800.0,
        "shortest time a workload stays routed (or back) before the next switch, so that routing cannot flap",
    )
    route_load_margin: int = setting(
        "proxy.route_load_margin",
        parse_int(0),
        1,
        "with on_net_loss = route and a measured load crossover C: a workload's requests go to the baseline from C "
        "in flight on the speculative replica, and back to speculation only below C minus this margin (at 1 always), "
        "so that the route does not flip with every request at the crossover",
    )
    route_refresh_s: float = setting(
        "proxy.route_refresh_s",
        parse_seconds,
        10.0,
        "how often the proxy reads the routing decisions the scheduler made",
    )
    engine_watch_s: float = setting(
        "proxy.engine_watch_s",
        parse_seconds,
        30.0,
        "how often the proxy reads each replica's version (/props, /version or /get_server_info), its drafter "
        "(llama.cpp /slots, SGLang's server arguments) and /metrics (its process start and KV-cache use), which each "
        "request's record then carries for the causes of a drop; 0 never reads them",
    )
    kind: str = setting(
        "proxy.kind",
        parse_choice(PROXY_KINDS),
        "auto",
        "the upstream's stack, which decides how its speculative counts are read: auto (by the response's shape), "
        "vllm, sglang, llamacpp, openai (usage only)",
    )
    speculative: str = setting(
        "proxy.speculative",
        parse_choice(("auto", "true", "false", "baseline", "candidate")),
        "auto",
        "whether the upstream decodes speculatively, where no baseline declares it (with a baseline the upstream "
        "pool is speculative, as true): true stores a request that drafted nothing as speculative with 0 drafts and "
        "refuses a response without counts; auto infers it per response, so an n-gram drafter's request that found "
        "no match is stored plain (flagged mode_inferred, kept out of the speedup estimate); false: plain; "
        "baseline: the upstream IS a deployment's plain baseline, its traffic split off by a gateway (draftwatch "
        "routes export), so every answer is stored as the holdout; candidate: the upstream IS a deployment's candidate "
        "drafter, its share split off by a gateway (routes export --candidate-service), so every answer is stored "
        "speculative under the active rollout's drafter name, for the judge",
    )
    timeout_s: float = setting(
        "proxy.timeout_s",
        parse_seconds,
        600.0,
        "longest wait for the upstream's response to start, or between two streamed chunks; past it the client "
        "gets 504",
    )
    max_body_bytes: int = setting(
        "proxy.max_body_bytes",
        parse_int(1024),
        100 * 1024 * 1024,
        "largest request body a proxied route reads (413 past it): engines take long prompts and images that "
        "api.max_body_bytes would refuse",
    )
    max_event_bytes: int = setting(
        "proxy.max_event_bytes",
        parse_int(1024),
        16 * 1024 * 1024,
        "largest streamed event the proxy reads: past it the rest of the stream is relayed as it comes, unread, and "
        "the request is counted in draftwatch_proxy_unrecorded_total (engines stream logprobs of a long prompt in "
        "events of megabytes)",
    )
    workload_header: str = setting(
        "proxy.workload_header",
        parse_str,
        "X-Workload",
        "request header naming a proxied request's workload; it is not forwarded",
    )
    workload_rules: tuple[WorkloadRule, ...] = setting(
        "proxy.workload_rules",
        parse_workload_rules,
        (),
        "workloads of requests without the header or a body metadata.workload: 'model:qwen*=code;path:/completion="
        "completion;user:bot-*=batch', first match wins",
    )
    default_workload: str = setting(
        "proxy.default_workload",
        parse_str,
        "default",
        "workload of a proxied request no header, metadata or rule names",
    )

    @property
    def has_baseline(self) -> bool:
        """Whether some deployment, the default or a route's, has a plain baseline to measure the speedup against.

        A sidecar in front of the baseline itself (``proxy.speculative = baseline``) counts: behind a
        gateway, the baseline's requests reach it, not the speculative pool's sidecar.
        """
        return self.baseline_beside or self.upstream_is_baseline

    @property
    def baseline_beside(self) -> bool:
        """Whether a baseline upstream is configured beside the speculative one, the default's or a route's."""
        return bool(self.baseline_upstream) or any(route.baseline_upstream for route in self.routes)

    @property
    def has_candidate(self) -> bool:
        """Whether some deployment, the default or a route's, has a candidate pool a rollout can give traffic to."""
        return bool(self.candidate_upstream) or any(route.candidate_upstream for route in self.routes)

    @property
    def upstream_is_baseline(self) -> bool:
        """Whether ``upstream`` is the plain baseline, its traffic split off by a gateway, every answer a holdout."""
        return self.speculative == "baseline"

    @property
    def upstream_is_candidate(self) -> bool:
        """Whether ``upstream`` is a rollout's candidate pool, its share split off by a gateway."""
        return self.speculative == "candidate"

    @property
    def upstream_is_current_pool(self) -> bool:
        """Whether ``upstream`` may be the speculative pool a baseline or a candidate pool beside it is compared
        with: neither declared plain nor another pool's role (a gateway's baseline or candidate)."""
        return self.speculative in ("auto", "true")

    @property
    def deployment_speculative(self) -> bool | None:
        """What the stack parsers are told of the deployment: speculative, plain, or None (infer it)."""
        return None if self.speculative == "auto" else self.speculative in ("true", "candidate")


def parse_steps(raw: Any) -> tuple[float, ...]:
    """Rollout steps: percentages of the speculative traffic, rising, the last 100 (``5,25,50,100``), as shares.

    >>> parse_steps("5, 25, 50, 100")
    (0.05, 0.25, 0.5, 1.0)
    >>> parse_steps("50,25,100")
    Traceback (most recent call last):
    ...
    ValueError: expected steps that rise, such as 5,25,50,100; 25 follows 50
    >>> parse_steps("100")
    Traceback (most recent call last):
    ...
    ValueError: expected a step below 100 before it, such as 5,100: passing the last step below 100 promotes
    """
    items = raw if isinstance(raw, list | tuple) else parse_str(raw).split(",")
    try:
        steps = [float(item) for item in items if not isinstance(item, str) or item.strip()]
    except (TypeError, ValueError):
        raise ValueError("expected percentages such as 5,25,50,100") from None
    if not steps or any(not 0 < s <= 100 for s in steps):
        raise ValueError("expected percentages above 0 and at most 100, such as 5,25,50,100")
    for before, after in itertools.pairwise(steps):
        if after <= before:
            raise ValueError(f"expected steps that rise, such as 5,25,50,100; {after:g} follows {before:g}")
    if steps[-1] != 100:
        raise ValueError(f"expected the last step to be 100 (the candidate serves everything), got {steps[-1]:g}")
    if len(steps) < 2:
        raise ValueError("expected a step below 100 before it, such as 5,100: passing the last step below 100 "
                         "promotes")  # fmt: skip
    return tuple(s / 100 for s in steps)


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutSettings:
    """A candidate drafter's rollout (``draftwatch rollout start``): its steps and how each is judged."""

    steps: tuple[float, ...] = setting(
        "rollout.steps",
        parse_steps,
        (0.05, 0.25, 0.5, 1.0),
        "the shares of a deployment's speculative traffic a rollout gives the candidate drafter in turn, in percent, "
        "rising to 100; each step below 100 lasts rollout.interval and advances when every judged workload passes, "
        "and passing the last of them promotes the candidate (100: it serves everything)",
    )
    interval: timedelta = setting(
        "rollout.interval",
        parse_duration,
        timedelta(minutes=30),
        "how long a rollout step lasts before the judge may advance it (a failing workload rolls back at once)",
    )
    tolerance: float = setting(
        "rollout.tolerance",
        parse_fraction,
        0.05,
        "how much slower (decode ms per token, time to first token) the candidate may be and still pass: 0.05 "
        "passes a candidate down to 0.95x the current drafter's speed; it fails beyond it with the interval's "
        "upper bound below",
    )
    ci_level: float = setting(
        "rollout.ci_level",
        parse_fraction,
        0.98,
        "the level of the judge's intervals: a candidate fails when the upper bound of its decode speed at this "
        "level is below 1 - rollout.tolerance; above the drift tests' 0.95 because a step is judged again every "
        "scheduler.rollout_interval (benchmarks/rollout.py: at 0.98 under 1 % of intervals fail a candidate equal "
        "to the current drafter, and 95 % of 20 % slower ones are caught within two intervals)",
    )
    min_requests: int = setting(
        "rollout.min_requests",
        parse_int(2),
        30,
        "requests with a decode time each side (candidate, current drafter) needs in a step before a workload is "
        "judged; below it the workload is listed as unjudged",
    )
    max_holds: int = setting(
        "rollout.max_holds",
        parse_int(1),
        3,
        "intervals a step may end without every judged workload passing (a marginal one, or none judged) before the "
        "rollout gives up and rolls back: a rollout neither waits forever nor passes what it could not judge. A hold "
        "is counted by a run of the judge that finds the step undecided, one an interval at most: intervals no run "
        "judged (the scheduler down) are none",
    )
    per_workload: bool = setting(
        "rollout.per_workload",
        parse_bool,
        False,
        "promote the candidate only on the workloads where it passes and keep the current drafter on the rest, "
        "instead of rolling the whole rollout back on one workload's failure",
    )
    drafter: str = setting(
        "rollout.drafter",
        parse_str,
        "candidate",
        "the name the candidate pool's requests are stored under (their pair's drafter), e.g. eagle3-v2",
    )
    max_extra_errors: float = setting(
        "rollout.max_extra_errors",
        parse_share,
        0.01,
        "how much higher the candidate's error rate may be than the current drafter's (0.01: one point) before the "
        "judge fails it",
    )
