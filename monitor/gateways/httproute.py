"""Today's routing decisions and the active rollout as a Gateway API ``HTTPRoute`` (``gateway.networking.k8s.io/v1``).

The route says what the proxy's router does (``monitor/proxy/routing.py``), in the gateway's terms:
the workload header (``proxy.workload_header``) is the match, and the pools are Services.

* ``plain``: requests naming a workload the scheduler routed to plain go to the baseline Service,
  but for a probe share that keeps reaching the speculative Service, so that the workload's speedup
  is still measured and it can come back;
* ``default``: every other request goes to the speculative Service, with the baseline's holdout
  share as the baseline Service's weight (or to the speculative Service alone, without a baseline);
* ``speculative``: only when the default workload (requests naming none) has a rule of its own
  (routed to plain, or decided by the rollout), so that ``default`` holds that state: requests naming
  any other workload keep the split every workload without a decision gets.

With a candidate Service (the same target with the new drafter) and a running rollout of the
default deployment (``draftwatch rollout start`` without ``--route``), the speculative share of each
rule is split again as the sidecar's router splits it (:meth:`Rollout.share`): the step's share
weighted to the candidate. Only a proxy's rollout (:attr:`Rollout.of_proxy`) is weighed: an
embedded decoder's, on the same default deployment, is its own candidate drafter's, as the sidecars
leave it too. A workload a per-workload rollout kept on the current drafter gets a rule
(``current``) without the candidate, one it promoted a rule (``candidate``) with the candidate
alone; a promoted rollout gives the candidate all of its share; a rolled back or aborted one is not
active and weighs nothing. A routed workload's probes are split the same way (``plain-current``,
``plain-candidate`` where its share differs from the other routed workloads').

A gateway cannot count each workload's holdouts per drift window as the holdout policy's target
does, so both shares are the one static ``baseline_share``. The rendering is pure: the decisions
and the rollout are read by the caller (``monitor.store.routing.latest_routing``,
``monitor.store.rollouts.active_rollouts``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

from monitor.store.rollouts import Rollout
from monitor.store.routing import RoutingEvent

API_VERSION: Final = "gateway.networking.k8s.io/v1"
# The limits the v1 CRD declares (its schema and CEL rules), checked here so that a route the API
# server would refuse is refused before it is sent.
MAX_RULES: Final = 16
MAX_MATCHES_PER_RULE: Final = 64
MAX_MATCHES: Final = 128
MAX_WEIGHT: Final = 1_000_000
_DNS_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SERVICE_NAME: Final = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # a DNS-1035 label
_HEADER_NAME: Final = re.compile(r"[A-Za-z0-9!#$%&'*+\-.^_`|~]+")


@dataclass(frozen=True, slots=True)
class Service:
    """A backend: a Service in the route's namespace and its port."""

    name: str
    port: int


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """Everything the route holds but the decisions: where it lives, its parent Gateway, its backends."""

    name: str
    namespace: str
    gateway: str
    speculative: Service
    baseline: Service | None
    baseline_share: float
    workload_header: str
    default_workload: str
    gateway_namespace: str | None = None
    gateway_section: str | None = None
    candidate: Service | None = None  # the same target with the new drafter, weighted while a rollout runs

    def __post_init__(self) -> None:
        _check("route name", self.name, _DNS_SUBDOMAIN, 253, "a DNS subdomain: lower-case letters, digits, '-', '.'")
        _check("namespace", self.namespace, _DNS_LABEL, 63, "a DNS label: lower-case letters, digits and '-'")
        _check("gateway", self.gateway, _DNS_SUBDOMAIN, 253, "a DNS subdomain: lower-case letters, digits, '-', '.'")
        if self.gateway_namespace is not None:
            _check("gateway namespace", self.gateway_namespace, _DNS_LABEL, 63, "a DNS label")
        if self.gateway_section is not None:
            _check("gateway section", self.gateway_section, _DNS_SUBDOMAIN, 253, "a listener's name, a DNS subdomain")
        roles = {"speculative": self.speculative, "baseline": self.baseline, "candidate": self.candidate}
        for role, service in roles.items():
            if service is None:
                continue
            _check(f"{role} service", service.name, _SERVICE_NAME, 63, "a Service name: a DNS-1035 label")
            if not 1 <= service.port <= 65535:
                raise ValueError(f"{role} service port {service.port}: expected a port 1-65535")
        others = {self.speculative.name, self.baseline.name if self.baseline else None}
        if self.candidate is not None and self.candidate.name in others:
            raise ValueError(f"candidate service {self.candidate.name!r} is also the speculative or baseline Service: "
                             "expected the Service of the pods serving the target with the new drafter")  # fmt: skip
        if not 0 <= self.baseline_share <= 1:
            raise ValueError(f"baseline share {self.baseline_share!r}: expected a share between 0 and 1")
        _check("workload header", self.workload_header, _HEADER_NAME, 256, "an HTTP header name (RFC 9110 token)")


def _check(what: str, value: str, pattern: re.Pattern[str], max_length: int, expected: str) -> None:
    if len(value) > max_length or not pattern.fullmatch(value):
        raise ValueError(f"{what} {value!r}: expected {expected}, at most {max_length} characters")


@dataclass(frozen=True, slots=True, order=True)
class _Split:
    """Where one rule's requests go: the baseline's weight as for a routed workload (all but the probes) or as the
    holdout, and the candidate's share of what stays on speculation."""

    routed: bool
    candidate_share: float


# No workload is named "" (decoder.record.WORKLOAD_PATTERN): its split is that of every workload without a decision.
_UNDECIDED: Final = ""


def render_httproute(
    spec: RouteSpec, decisions: Mapping[str, RoutingEvent], rollout: Rollout | None = None
) -> dict[str, Any]:
    """The ``HTTPRoute`` for ``decisions`` (each workload's latest switch) and ``rollout`` (the default deployment's
    active rollout, if any; weighed only with a candidate Service), as a Kubernetes object."""
    # A workload routed by load goes plain only while its speculative replica is busy, which no weight can follow:
    # the gateway keeps it on the default split, where the sidecar's own load routing acts.
    routed = (
        {w for w, event in decisions.items() if event.routed and event.above_inflight is None}
        if spec.baseline
        else set()
    )
    proxied = rollout is not None and rollout.active and rollout.of_proxy  # not an embedded decoder's
    staged = rollout if spec.candidate is not None and proxied else None

    def split(workload: str) -> _Split:
        return _Split(workload in routed, staged.share(workload) if staged else 0.0)

    anyone = split(_UNDECIDED)
    groups: dict[_Split, list[str]] = {}
    for workload in sorted(routed | set(staged.workloads if staged else ())):
        if split(workload) != anyone:
            groups.setdefault(split(workload), []).append(workload)
    rules: list[dict[str, Any]] = []
    for _, name, key in sorted((not key.routed, _rule_name(key, anyone), key) for key in groups):
        workloads = groups[key]
        for start in range(0, len(workloads), MAX_MATCHES_PER_RULE):
            chunk = workloads[start : start + MAX_MATCHES_PER_RULE]
            numbered = name if start == 0 else f"{name}-{start // MAX_MATCHES_PER_RULE + 1}"
            by_header = [_header(spec, "Exact", w) for w in chunk]
            rules.append({"name": numbered, "matches": by_header, "backendRefs": _backends(spec, key)})
    default = split(spec.default_workload)
    if default != anyone:
        # Exact matches tie with this one on the header count, and a tie goes to the rule listed first.
        rules.append({"name": "speculative", "matches": [_header(spec, "RegularExpression", ".*")],
                      "backendRefs": _backends(spec, anyone)})  # fmt: skip
    rules.append({"name": "default", "backendRefs": _backends(spec, default)})
    matches = sum(len(rule.get("matches", [None])) for rule in rules)  # no matches: the one PathPrefix "/"
    if len(rules) > MAX_RULES or matches > MAX_MATCHES:
        raise ValueError(
            f"{sum(map(len, groups.values()))} workloads with a rule of their own (routed to plain, or kept or "
            f"promoted by the rollout) need {matches} matches in {len(rules)} rules: one HTTPRoute holds at most "
            f"{MAX_MATCHES} in {MAX_RULES} (Gateway API v1), so the gateway cannot take them all"
        )
    parent: dict[str, Any] = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": spec.gateway}
    if spec.gateway_namespace:
        parent["namespace"] = spec.gateway_namespace
    if spec.gateway_section:
        parent["sectionName"] = spec.gateway_section
    return {
        "apiVersion": API_VERSION,
        "kind": "HTTPRoute",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": {"app.kubernetes.io/managed-by": "draftwatch"},
        },
        "spec": {"parentRefs": [parent], "rules": rules},
    }


def to_yaml(obj: Mapping[str, Any]) -> str:
    """A Kubernetes object as YAML, its keys in the order the object lists them (as kubectl shows them)."""
    return yaml.safe_dump(dict(obj), sort_keys=False, default_flow_style=False)


def _header(spec: RouteSpec, kind: str, value: str) -> dict[str, Any]:
    # Each match its own objects: a value shared between two places would be dumped as a YAML alias.
    return {"path": {"type": "PathPrefix", "value": "/"},
            "headers": [{"type": kind, "name": spec.workload_header, "value": value}]}  # fmt: skip


def _rule_name(key: _Split, anyone: _Split) -> str:
    """``plain`` for routed workloads; ``current`` and ``candidate`` for those the rollout decided (none, all)."""
    side = "candidate" if key.candidate_share == 1.0 else "current"
    if key.routed:
        return "plain" if key.candidate_share == anyone.candidate_share else f"plain-{side}"
    return side


def _backends(spec: RouteSpec, split: _Split) -> list[dict[str, Any]]:
    """The backendRefs of ``split``: weights in millionths, reduced (95:5 is 19:1); a Service weighted 0 is left out."""
    if spec.baseline is None:
        to_baseline = 0
    else:
        to_baseline = round((1.0 - spec.baseline_share if split.routed else spec.baseline_share) * MAX_WEIGHT)
    speculative = MAX_WEIGHT - to_baseline
    to_candidate = round(split.candidate_share * speculative)
    weighted = [(spec.speculative, speculative - to_candidate), (spec.candidate, to_candidate),
                (spec.baseline, to_baseline)]  # fmt: skip
    present = [(service, weight) for service, weight in weighted if service is not None and weight]
    divisor = math.gcd(*(weight for _, weight in present))
    return [_ref(service, weight // divisor) for service, weight in present]


def _ref(service: Service, weight: int) -> dict[str, Any]:
    return {"group": "", "kind": "Service", "name": service.name, "port": service.port, "weight": weight}
