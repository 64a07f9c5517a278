"""Today's routing decisions as a Gateway API ``HTTPRoute`` (``gateway.networking.k8s.io/v1``).

The route says what the proxy's router does (``monitor/proxy/routing.py``), in the gateway's terms:
the workload header (``proxy.workload_header``) is the match, and the two pools are two Services.

* ``plain``: requests naming a workload the scheduler routed to plain go to the baseline Service,
  but for a probe share that keeps reaching the speculative Service, so that the workload's speedup
  is still measured and it can come back;
* ``default``: every other request goes to the speculative Service, with the baseline's holdout
  share as the baseline Service's weight (or to the speculative Service alone, without a baseline);
* ``speculative``: only when the default workload (requests naming none) is itself routed to plain,
  so that ``default`` holds that state: requests naming any other workload stay speculative.

A gateway cannot count each workload's holdouts per drift window as the holdout policy's target
does, so both shares are the one static ``baseline_share``. The rendering is pure: the decisions
are read by the caller (``monitor.store.routing.latest_routing``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

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

    def __post_init__(self) -> None:
        _check("route name", self.name, _DNS_SUBDOMAIN, 253, "a DNS subdomain: lower-case letters, digits, '-', '.'")
        _check("namespace", self.namespace, _DNS_LABEL, 63, "a DNS label: lower-case letters, digits and '-'")
        _check("gateway", self.gateway, _DNS_SUBDOMAIN, 253, "a DNS subdomain: lower-case letters, digits, '-', '.'")
        if self.gateway_namespace is not None:
            _check("gateway namespace", self.gateway_namespace, _DNS_LABEL, 63, "a DNS label")
        if self.gateway_section is not None:
            _check("gateway section", self.gateway_section, _DNS_SUBDOMAIN, 253, "a listener's name, a DNS subdomain")
        for role, service in (("speculative", self.speculative), ("baseline", self.baseline)):
            if service is None:
                continue
            _check(f"{role} service", service.name, _SERVICE_NAME, 63, "a Service name: a DNS-1035 label")
            if not 1 <= service.port <= 65535:
                raise ValueError(f"{role} service port {service.port}: expected a port 1-65535")
        if not 0 <= self.baseline_share <= 1:
            raise ValueError(f"baseline share {self.baseline_share!r}: expected a share between 0 and 1")
        _check("workload header", self.workload_header, _HEADER_NAME, 256, "an HTTP header name (RFC 9110 token)")


def _check(what: str, value: str, pattern: re.Pattern[str], max_length: int, expected: str) -> None:
    if len(value) > max_length or not pattern.fullmatch(value):
        raise ValueError(f"{what} {value!r}: expected {expected}, at most {max_length} characters")


def render_httproute(spec: RouteSpec, decisions: Mapping[str, RoutingEvent]) -> dict[str, Any]:
    """The ``HTTPRoute`` for ``decisions`` (each workload's latest switch), as a Kubernetes object."""
    routed = sorted(w for w, event in decisions.items() if event.routed) if spec.baseline else []
    # A routed workload keeps a probe share on the speculative pool; every other one holds out the share.
    plain, speculative = spec.baseline_share, 1.0 - spec.baseline_share
    rules: list[dict[str, Any]] = []
    for start in range(0, len(routed), MAX_MATCHES_PER_RULE):
        chunk = routed[start : start + MAX_MATCHES_PER_RULE]
        name = "plain" if start == 0 else f"plain-{start // MAX_MATCHES_PER_RULE + 1}"
        by_header = [_header(spec, "Exact", w) for w in chunk]
        rules.append({"name": name, "matches": by_header, "backendRefs": _backends(spec, plain)})
    default_routed = spec.default_workload in routed
    if default_routed:
        # Exact matches tie with this one on the header count, and a tie goes to the rule listed first.
        rules.append({"name": "speculative", "matches": [_header(spec, "RegularExpression", ".*")],
                      "backendRefs": _backends(spec, speculative)})  # fmt: skip
    rules.append({"name": "default", "backendRefs": _backends(spec, plain if default_routed else speculative)})
    matches = sum(len(rule.get("matches", [None])) for rule in rules)  # no matches: the one PathPrefix "/"
    if len(rules) > MAX_RULES or matches > MAX_MATCHES:
        raise ValueError(
            f"{len(routed)} workloads routed to plain need {matches} matches in {len(rules)} rules: one HTTPRoute "
            f"holds at most {MAX_MATCHES} in {MAX_RULES} (Gateway API v1), so the gateway cannot take them all"
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


def _backends(spec: RouteSpec, speculative_share: float) -> list[dict[str, Any]]:
    """The backendRefs splitting requests at ``speculative_share``: weights in millionths, reduced (95:5 is 19:1)."""
    if spec.baseline is None:
        return [_ref(spec.speculative, 1)]
    to_speculative = round(speculative_share * MAX_WEIGHT)
    weighted = ((spec.speculative, to_speculative), (spec.baseline, MAX_WEIGHT - to_speculative))
    divisor = math.gcd(to_speculative, MAX_WEIGHT - to_speculative)
    return [_ref(service, weight // divisor) for service, weight in weighted if weight]


def _ref(service: Service, weight: int) -> dict[str, Any]:
    return {"group": "", "kind": "Service", "name": service.name, "port": service.port, "weight": weight}
