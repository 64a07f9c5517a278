"""``draftwatch routes export [--apply]``: the decisions and the rollout as an HTTPRoute, and its RBAC (deploy/gateway).

The decisions are written by the scheduler's own path (``decide_routes``), the rollouts by
``monitor.proxy.rollout``'s (started, judged on stored records, promoted, aborted), into a real
store, SQLite and PostgreSQL. The route is checked against the HTTPRoute CRD's published schema (vendored from
gateway-api v1.6.1) and the CEL limits the schema cannot say. No Kubernetes API server installs
here (none on PyPI or in Debian), so ``--apply`` meets a real HTTPS server that answers as the API
server does (see :class:`ApiServer`).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar, Final
from urllib.parse import parse_qs, urlsplit

import jsonschema
import kubernetes_validate
import numpy as np
import pytest
import yaml
from sqlalchemy.engine import Engine

from decoder.candidate import Candidate
from monitor.commands import routes as routes_command
from monitor.commands.main import build_parser, main
from monitor.config import Settings, all_specs
from monitor.drift.verdict import Verdict, VerdictName
from monitor.gateways.httproute import MAX_MATCHES, RouteSpec, Service, render_httproute, to_yaml
from monitor.gateways.kube import KubeError, apply, find_cluster
from monitor.proxy.decide import decide_routes
from monitor.proxy.rollout import abort, advance_rollouts, promote, start_rollout
from monitor.proxy.settings import ProxySettings, RolloutSettings
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.rollouts import CURRENT_DRAFTER, Rollout, active_rollouts, save_rollout
from monitor.store.routing import RoutingEvent, latest_routing, load_reason
from monitor.store.writes.writer import write_batch
from tests.deploy.test_manifests import proxies, render, resolved_env
from tests.records import api_record
from tests.serving import free_port

ROOT: Final = Path(__file__).resolve().parents[2]
FIXTURE: Final = json.loads((ROOT / "tests/fixtures/gateway-api-v1.6.1-httproute-v1-schema.json").read_text())
SCHEMA: Final = jsonschema.Draft7Validator(FIXTURE["openAPIV3Schema"])
KUBECTL: Final = ROOT / ".venv/bin/kubectl"
T0: Final = datetime(2026, 3, 1, 12, tzinfo=UTC)
SPEC: Final = RouteSpec(
    name="draftwatch",
    namespace="serving",
    gateway="inference-gateway",
    speculative=Service("engine", 80),
    baseline=Service("engine-plain", 80),
    baseline_share=0.05,
    workload_header="X-Workload",
    default_workload="default",
)
ROUTING: Final = ProxySettings(
    upstream=("http://engine:80",), baseline_upstream=("http://engine-plain:80",), on_net_loss="route",
    route_min_dwell_s=0,
)  # fmt: skip


def verdict(workload: str, name: VerdictName) -> Verdict:
    speedup, ci = (0.6, (0.5, 0.7)) if name == "net_loss" else (1.4, (1.2, 1.6))
    return Verdict(workload, "qwen-1.5b/ngram", name, f"{speedup}x", speedup, ci, True, 200, 40)


def decide(engine: Engine, at: datetime, **verdicts: VerdictName) -> None:
    """The scheduler's routing decision after a drift run with these verdicts, written to the store."""
    decide_routes(engine, ROUTING, [verdict(w, name) for w, name in verdicts.items()], at)


def check_against_crd(route: dict[str, Any]) -> None:
    """The v1 schema, then the CEL rules it carries that jsonschema cannot run, as the API server would."""
    SCHEMA.validate(route)
    rules = route["spec"]["rules"]
    # The rules' matches default to one PathPrefix "/" each; the route's total is at most 128.
    assert sum(len(rule.get("matches", [{}])) for rule in rules) <= MAX_MATCHES
    for rule in rules:
        for ref in rule["backendRefs"]:
            assert ref["group"] != "" or ref["kind"] != "Service" or "port" in ref  # Must have port for Service
        for match in rule.get("matches", []):
            names = [h["name"].lower() for h in match.get("headers", [])]
            assert len(names) == len(set(names))  # a list map keyed by name


def test_the_vendored_schema_refuses_what_the_api_server_would() -> None:
    good = render_httproute(SPEC, switched("qa"))
    SCHEMA.validate(good)
    bad_weight = json.loads(json.dumps(good))
    bad_weight["spec"]["rules"][0]["backendRefs"][0]["weight"] = 1_000_001
    bad_header = json.loads(json.dumps(good))
    bad_header["spec"]["rules"][0]["matches"][0]["headers"][0]["name"] = "X Workload"
    too_many = json.loads(json.dumps(good))
    too_many["spec"]["rules"] = good["spec"]["rules"] * 9
    for bad in (bad_weight, bad_header, too_many):
        assert not SCHEMA.is_valid(bad)
    assert FIXTURE["bundle_version"] == "v1.6.1" and FIXTURE["channel"] == "standard"


def by_name(route: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rule["name"]: rule for rule in route["spec"]["rules"]}


def workloads_of(rule: dict[str, Any]) -> list[str]:
    return [h["value"] for m in rule["matches"] for h in m["headers"] if h["type"] == "Exact"]


def weights(rule: dict[str, Any]) -> dict[str, int]:
    return {ref["name"]: ref["weight"] for ref in rule["backendRefs"]}


# Rendering from a real store


def test_a_measured_net_loss_sends_the_workload_to_plain_with_its_probes_and_the_rest_holds_out(
    engine: Engine,
) -> None:
    decide(engine, T0, qa="net_loss", chat="net_loss", code="pays")
    route = render_httproute(SPEC, latest_routing(engine))
    check_against_crd(route)
    rules = by_name(route)
    assert list(rules) == ["plain", "default"]
    assert workloads_of(rules["plain"]) == ["chat", "qa"]
    assert rules["plain"]["matches"][0] == {
        "path": {"type": "PathPrefix", "value": "/"},
        "headers": [{"type": "Exact", "name": "X-Workload", "value": "chat"}],
    }
    # 5 % as weights: the probes of a routed workload, the holdout of every other one.
    assert weights(rules["plain"]) == {"engine": 1, "engine-plain": 19}
    assert "matches" not in rules["default"]
    assert weights(rules["default"]) == {"engine": 19, "engine-plain": 1}
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway"}
    ]
    assert route["metadata"]["namespace"] == "serving"


def test_a_workload_that_pays_again_moves_back_to_the_default_rule(engine: Engine) -> None:
    decide(engine, T0, qa="net_loss", chat="net_loss")
    decide(engine, T0 + timedelta(hours=1), qa="pays")
    assert workloads_of(by_name(render_httproute(SPEC, latest_routing(engine)))["plain"]) == ["chat"]
    decide(engine, T0 + timedelta(hours=2), chat="pays")
    route = render_httproute(SPEC, latest_routing(engine))
    check_against_crd(route)
    assert [rule["name"] for rule in route["spec"]["rules"]] == ["default"]


def test_an_empty_store_renders_the_default_rule_only(engine: Engine) -> None:
    route = render_httproute(SPEC, latest_routing(engine))
    check_against_crd(route)
    (rule,) = route["spec"]["rules"]
    assert rule["name"] == "default" and weights(rule) == {"engine": 19, "engine-plain": 1}


def test_with_the_default_workload_routed_requests_naming_another_stay_speculative(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'routes.db'}")
    upgrade(engine)
    decide(engine, T0, default="net_loss")
    route = render_httproute(SPEC, latest_routing(engine))
    engine.dispose()
    check_against_crd(route)
    rules = route["spec"]["rules"]
    # Header rules tie on their count of header matches, so the exact one must come first to win.
    assert [rule["name"] for rule in rules] == ["plain", "speculative", "default"]
    assert workloads_of(rules[0]) == ["default"]
    assert rules[1]["matches"][0]["headers"] == [{"type": "RegularExpression", "name": "X-Workload", "value": ".*"}]
    assert weights(rules[1]) == {"engine": 19, "engine-plain": 1}
    assert weights(rules[2]) == weights(rules[0]) == {"engine": 1, "engine-plain": 19}
    assert not re.search(r"[&*]id\d", to_yaml(route))  # plain YAML, no anchors and aliases


def switched(*workloads: str, routed: bool = True) -> dict[str, RoutingEvent]:
    return {w: RoutingEvent(T0, w, "qwen-1.5b", routed, "net loss", 0.6, 0.5, 0.7) for w in workloads}


@pytest.mark.parametrize(
    ("share", "default", "plain"),
    [
        (0.05, {"engine": 19, "engine-plain": 1}, {"engine": 1, "engine-plain": 19}),
        (0.3, {"engine": 7, "engine-plain": 3}, {"engine": 3, "engine-plain": 7}),
        (0.012345, {"engine": 197531, "engine-plain": 2469}, {"engine": 2469, "engine-plain": 197531}),
        (0.0, {"engine": 1}, {"engine-plain": 1}),  # no holdout and no probes: one backend each
    ],
)
def test_the_share_becomes_weights_the_crd_accepts(
    share: float, default: dict[str, int], plain: dict[str, int]
) -> None:
    route = render_httproute(replace(SPEC, baseline_share=share), switched("qa"))
    check_against_crd(route)
    rules = by_name(route)
    assert weights(rules["default"]) == default and weights(rules["plain"]) == plain


def test_a_workload_routed_by_load_stays_on_the_default_split_which_no_weight_could_follow() -> None:
    by_load = RoutingEvent(
        T0, "chat", "qwen-1.5b", True, load_reason(4, "loses from 4 in flight"), 0.6, 0.5, 0.7, above_inflight=4
    )
    route = render_httproute(SPEC, {**switched("qa"), "chat": by_load})
    check_against_crd(route)
    rules = by_name(route)
    assert [m["headers"][0]["value"] for m in rules["plain"]["matches"]] == ["qa"]
    assert weights(rules["default"]) == {"engine": 19, "engine-plain": 1}


def test_without_a_baseline_every_request_goes_to_the_speculative_service() -> None:
    route = render_httproute(replace(SPEC, baseline=None), switched("qa"))
    check_against_crd(route)
    (rule,) = route["spec"]["rules"]
    assert weights(rule) == {"engine": 1}


def test_routed_workloads_fill_rules_of_64_matches_up_to_the_route_s_128_and_no_further() -> None:
    names = [f"w{i:03d}" for i in range(MAX_MATCHES - 1)]  # and the default rule's implicit match
    route = render_httproute(SPEC, {**switched(*names), **switched("back", routed=False)})
    check_against_crd(route)
    rules = by_name(route)
    assert list(rules) == ["plain", "plain-2", "default"]
    assert workloads_of(rules["plain"]) + workloads_of(rules["plain-2"]) == names
    assert len(rules["plain"]["matches"]) == 64
    too_many = r"^128 workloads with a rule of their own \(routed to plain, or kept or promoted by the rollout\) "
    with pytest.raises(ValueError, match=too_many + "need 129 matches in 3 rules"):
        render_httproute(SPEC, switched(*names, "w127"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "Draft_Watch"}, "route name 'Draft_Watch': expected a DNS subdomain"),
        ({"namespace": "a.b"}, "namespace 'a.b': expected a DNS label"),
        ({"workload_header": "X Workload"}, "workload header 'X Workload': expected an HTTP header name"),
        ({"speculative": Service("9engine", 80)}, "speculative service '9engine': expected a Service name"),
        ({"baseline": Service("engine-plain", 0)}, "baseline service port 0: expected a port 1-65535"),
        ({"candidate": Service("Engine-Next", 80)}, "candidate service 'Engine-Next': expected a Service name"),
        ({"candidate": Service("engine", 80)}, "candidate service 'engine' is also the speculative or baseline"),
    ],
)
def test_a_name_the_api_server_would_refuse_is_refused_with_its_value(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        replace(SPEC, **change)


# A rollout's weights: the candidate Service beside the speculative one


CANDIDATE_SPEC: Final = replace(SPEC, candidate=Service("engine-candidate", 80))
CANARY: Final = ProxySettings(upstream=("http://engine:80",), candidate_upstream=("http://engine-candidate:80",))
DRAFTER: Final = "ngram-m16"
# The embedded decoder's candidate drafter (decoder.candidate): a rollout of it is the default deployment's too.
EMBEDDED: Final = Candidate("ngram", ngram_min=1, ngram_max=4)
STEP: Final = timedelta(minutes=10)
_requests = itertools.count()


def rollout_settings(**changes: Any) -> RolloutSettings:
    return replace(RolloutSettings(steps=(0.25, 0.5, 1.0), interval=STEP, min_requests=20, drafter=DRAFTER), **changes)


def exported(engine: Engine, spec: RouteSpec = CANDIDATE_SPEC) -> dict[str, dict[str, Any]]:
    """The route ``routes export --candidate-service engine-candidate`` renders from the store, checked, by rule."""
    route = render_httproute(spec, latest_routing(engine), active_rollouts(engine).get("*"))
    check_against_crd(route)
    return by_name(route)


def served(engine: Engine, start: datetime, speeds: dict[str, tuple[float, float]]) -> None:
    """Per workload, 40 speculative requests on each drafter as the sidecar stores them (the current one under
    ``upstream``, the candidate under the rollout's name), at (current, candidate) ms per token, lognormal."""
    rng = np.random.default_rng(int(start.timestamp()))
    records = []
    for workload, pair in sorted(speeds.items()):
        for drafter, ms in zip((CURRENT_DRAFTER, DRAFTER), pair, strict=True):
            for i, per_token in enumerate(rng.lognormal(np.log(ms), 0.15, 40).tolist()):
                ts = start + timedelta(seconds=7 * i)
                records.append(api_record(
                    f"q{next(_requests)}", ts_start=ts, ts_end=ts + timedelta(seconds=1), workload=workload,
                    drafter=drafter, target_model="smollm2-135m", draft_model=None, output_tokens=33,
                    decode_ms=per_token * 32, ttft_ms=40.0, latency_ms=40.0 + per_token * 32, upstream_inflight=1,
                ))  # fmt: skip
    with engine.begin() as conn:
        write_batch(conn, records, f"b{next(_requests)}", "sync")


def test_a_running_rollout_weighs_the_candidate_at_its_step_s_share_of_the_speculative_requests(
    engine: Engine,
) -> None:
    decide(engine, T0, qa="net_loss")
    r = start_rollout(engine, CANARY, rollout_settings(), T0)
    rules = exported(engine)
    assert list(rules) == ["plain", "default"]
    # 5 % held out for the baseline, a quarter of the other 95 % to the candidate: 71.25 : 23.75 : 5.
    assert weights(rules["default"]) == {"engine": 57, "engine-candidate": 19, "engine-plain": 4}
    # A routed workload's 5 % of probes are split as the sidecar splits them.
    assert weights(rules["plain"]) == {"engine": 3, "engine-candidate": 1, "engine-plain": 76}
    with engine.begin() as conn:
        save_rollout(conn, replace(r, step=1))
    assert weights(exported(engine)["default"]) == {"engine": 19, "engine-candidate": 19, "engine-plain": 2}
    # Without a candidate Service the route weighs no rollout: the sidecars split, where they have the pool.
    assert weights(exported(engine, SPEC)["default"]) == {"engine": 19, "engine-plain": 1}


def test_per_workload_a_kept_workload_gets_the_current_drafter_and_the_promoted_ones_the_candidate(
    engine: Engine,
) -> None:
    settings = rollout_settings(per_workload=True)
    start_rollout(engine, CANARY, settings, T0)
    served(engine, T0, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
    (kept,) = advance_rollouts(engine, settings, T0 + timedelta(minutes=5, seconds=1))
    assert (kept.kind, kept.workload) == ("kept", "story")
    rules = exported(engine)
    assert list(rules) == ["current", "default"]
    assert workloads_of(rules["current"]) == ["story"]
    assert weights(rules["current"]) == {"engine": 19, "engine-plain": 1}
    assert weights(rules["default"]) == {"engine": 57, "engine-candidate": 19, "engine-plain": 4}
    t = T0
    for kind in ("advanced", "promoted"):
        served(engine, t, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
        t += STEP + timedelta(seconds=1)
        (event,) = advance_rollouts(engine, settings, t)
        assert event.kind == kind, event.reason
    rules = exported(engine)
    # Promoted where it won: copy on the candidate alone; story, like any workload it never won, on the current.
    assert list(rules) == ["candidate", "default"]
    assert workloads_of(rules["candidate"]) == ["copy"]
    assert weights(rules["candidate"]) == {"engine-candidate": 19, "engine-plain": 1}
    assert weights(rules["default"]) == {"engine": 19, "engine-plain": 1}


def test_a_promoted_rollout_takes_all_of_the_speculative_weight_and_an_ended_one_none(engine: Engine) -> None:
    decide(engine, T0, qa="net_loss")
    r = start_rollout(engine, CANARY, rollout_settings(), T0)
    assert r.id is not None
    promote(engine, r.id, T0 + STEP)
    rules = exported(engine)
    assert weights(rules["default"]) == {"engine-candidate": 19, "engine-plain": 1}
    assert weights(rules["plain"]) == {"engine-candidate": 1, "engine-plain": 19}
    abort(engine, r.id, T0 + 2 * STEP)
    rules = exported(engine)
    assert weights(rules["default"]) == {"engine": 19, "engine-plain": 1}
    assert weights(rules["plain"]) == {"engine": 1, "engine-plain": 19}


def test_a_rolled_back_rollout_weighs_nothing(engine: Engine) -> None:
    start_rollout(engine, CANARY, rollout_settings(), T0)
    served(engine, T0, {"copy": (10.0, 7.0), "story": (10.0, 13.0)})
    (event,) = advance_rollouts(engine, rollout_settings(), T0 + timedelta(minutes=5, seconds=1))
    assert event.kind == "rolled_back", event.reason
    (rule,) = exported(engine).values()
    assert weights(rule) == {"engine": 19, "engine-plain": 1}


def test_the_embedded_decoder_s_rollout_of_the_default_deployment_weighs_nothing(engine: Engine) -> None:
    """Its candidate is the embedded decoder's drafter, judged against its portfolio: not the candidate Service."""
    decide(engine, T0, qa="net_loss")
    r = start_rollout(engine, ProxySettings(), rollout_settings(), T0, embedded=EMBEDDED)
    assert r.deployment == "*" and not r.of_proxy
    rules = exported(engine)
    assert weights(rules["default"]) == {"engine": 19, "engine-plain": 1}
    assert weights(rules["plain"]) == {"engine": 1, "engine-plain": 19}
    assert r.id is not None
    promote(engine, r.id, T0 + STEP)
    assert weights(exported(engine)["default"]) == {"engine": 19, "engine-plain": 1}


def test_with_the_default_workload_kept_other_named_workloads_keep_the_step_s_split(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'routes.db'}")
    upgrade(engine)
    r = start_rollout(engine, CANARY, rollout_settings(), T0)
    with engine.begin() as conn:
        save_rollout(conn, replace(r, workloads={"default": "current"}))
    rules = exported(engine)
    engine.dispose()
    assert list(rules) == ["current", "speculative", "default"]
    assert workloads_of(rules["current"]) == ["default"]
    assert weights(rules["speculative"]) == {"engine": 57, "engine-candidate": 19, "engine-plain": 4}
    assert weights(rules["default"]) == weights(rules["current"]) == {"engine": 19, "engine-plain": 1}


def test_a_routed_workload_the_rollout_decided_has_its_probes_split_its_own_way() -> None:
    at = datetime(2026, 3, 1, tzinfo=UTC)
    running = Rollout("*", DRAFTER, (0.25, 1.0), 600.0, True, at, at, workloads={"qa": "current", "chat": "candidate"})
    rules = by_name(render_httproute(CANDIDATE_SPEC, switched("qa", "chat", "batch"), running))
    assert list(rules) == ["plain", "plain-candidate", "plain-current", "default"]
    assert [workloads_of(rules[n]) for n in ("plain", "plain-candidate", "plain-current")] == [["batch"], ["chat"],
                                                                                                ["qa"]]  # fmt: skip
    assert weights(rules["plain-candidate"]) == {"engine-candidate": 1, "engine-plain": 19}
    assert weights(rules["plain-current"]) == {"engine": 1, "engine-plain": 19}


@pytest.mark.parametrize("holdout", [0.0, 0.05, 0.3, 0.012345])
@pytest.mark.parametrize("step", [0.01, 0.05, 1 / 3, 0.5, 0.999])
def test_the_three_weights_are_the_shares_in_millionths_or_finer(holdout: float, step: float) -> None:
    at = datetime(2026, 3, 1, tzinfo=UTC)
    running = Rollout("*", DRAFTER, (step, 1.0), 600.0, False, at, at)
    route = render_httproute(replace(CANDIDATE_SPEC, baseline_share=holdout), {}, running)
    check_against_crd(route)
    (rule,) = route["spec"]["rules"]
    got = weights(rule)
    total = sum(got.values())
    assert total <= 1_000_000 and all(w >= 1 for w in got.values())
    expected = {"engine": (1 - holdout) * (1 - step), "engine-candidate": (1 - holdout) * step, "engine-plain": holdout}
    for service, share in expected.items():
        assert got.get(service, 0) / total == pytest.approx(share, abs=1e-6), service


# deploy/gateway: the RBAC and the CronJob


def rendered(folder: str) -> list[dict[str, Any]]:
    done = subprocess.run([str(KUBECTL), "kustomize", str(ROOT / folder)], capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def test_deploy_gateway_is_valid_and_grants_only_what_apply_needs() -> None:
    objects = rendered("deploy/gateway")
    for obj in objects:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    kinds = {obj["kind"]: obj for obj in objects}
    assert sorted(kinds) == ["ConfigMap", "CronJob", "Role", "RoleBinding", "ServiceAccount"]
    (rule,) = kinds["Role"]["rules"]
    assert rule == {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes"],
                    "verbs": ["get", "patch", "create"]}  # fmt: skip
    binding = kinds["RoleBinding"]
    assert binding["roleRef"]["name"] == kinds["Role"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": kinds["ServiceAccount"]["metadata"]["name"]}]
    pod = kinds["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == kinds["ServiceAccount"]["metadata"]["name"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:4] == ["draftwatch", "routes", "export", "--apply"]
    args = build_parser().parse_args(command[1:])
    assert args.handler is not None and args.apply
    env = {e["name"] for e in container["env"]}
    variables = {spec.env for _, spec in all_specs()}
    assert {n for n in env if n.startswith("DRAFTWATCH_")} <= variables
    assert "$(POD_NAMESPACE)" in command and "POD_NAMESPACE" in env  # Kubernetes expands it from the env


@pytest.mark.parametrize("fleet", ["fleet", "canary"])
def test_the_cron_job_s_settings_are_its_own_config_map_and_the_fleet_s_sidecars(fleet: str, tmp_path: Path) -> None:
    """deploy/gateway is built and applied on its own: ../fleet's ConfigMap, generated there with a hash suffix
    (draftwatch-fleet-<hash>), is no name it can refer to. Its own generated ConfigMap is (kustomize renames the
    reference in the CronJob's pod template), and it holds what the fleet's sidecars read the workload and the
    holdout share by."""
    objects = rendered("deploy/gateway")
    config_maps = {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "ConfigMap"}
    (cronjob,) = (obj for obj in objects if obj["kind"] == "CronJob")
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for source in container["envFrom"]:
        ref = source["configMapRef"]
        assert ref["name"] in config_maps, f"ConfigMap {ref['name']!r} is not rendered by deploy/gateway"
        assert not ref.get("optional"), "an optional ConfigMap that is missing fails nothing: its settings are lost"
        env |= config_maps[ref["name"]]["data"]
    env |= {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert {n for n in env if n.startswith("DRAFTWATCH_")} <= {spec.env for _, spec in all_specs()}

    def read_by(values: dict[str, str]) -> tuple[str, str, float]:
        settings = Settings.from_env({"HOME": str(tmp_path), **values}, None)
        return settings.proxy.workload_header, settings.proxy.default_workload, settings.decoder.holdout_share

    sidecars = [resolved_env(render(fleet), sidecar) for _, sidecar, _ in proxies(render(fleet))]
    assert sidecars and {read_by(sidecar) for sidecar in sidecars} == {read_by(env)}


def test_the_command_s_default_services_are_deploy_base_s() -> None:
    services = {
        doc["metadata"]["name"]: doc["spec"]["ports"][0]["port"]
        for file in ("engine.yaml", "plain.yaml")
        for doc in yaml.safe_load_all((ROOT / "deploy/base" / file).read_text())
        if doc and doc["kind"] == "Service"
    }
    assert services == {
        routes_command.SPECULATIVE_SERVICE: routes_command.SERVICE_PORT,
        routes_command.BASELINE_SERVICE: routes_command.SERVICE_PORT,
    }


# --apply against an HTTPS server that answers as the Kubernetes API does


@dataclass
class ApiServer:
    """What kube-apiserver v1.37 checks and answers for a server-side apply of an HTTPRoute, nothing else.

    Authentication first (a bearer token it knows, else 401), then the resource's path (without the
    Gateway API CRDs installed the group is not served: a bare ``404 page not found``), the namespace
    (a ``Status`` 404 naming ``namespaces``), the apply request's form (``application/apply-patch+yaml``
    else 415; ``fieldManager`` required, 422), RBAC (verb ``patch``, and ``create`` when the apply
    creates the object, else a 403 ``Status`` naming the verb), the object's name against the URL's
    (400) and the CRD's schema (422 Invalid); then 201 with the object created, 200 once it exists.
    """

    tokens: dict[str, set[str]]  # bearer token: the verbs RBAC grants it on httproutes
    namespaces: set[str] = field(default_factory=lambda: {"serving"})
    crds_installed: bool = True
    stored: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    PATH: ClassVar = re.compile(r"/apis/gateway\.networking\.k8s\.io/v1/namespaces/([^/]+)/httproutes/([^/]+)")

    def answer(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, str, bytes]:
        url = urlsplit(target)
        query = parse_qs(url.query)
        self.requests.append({"method": method, "path": url.path, "query": query, "headers": headers})
        token = headers.get("authorization", "").removeprefix("Bearer ")
        if token not in self.tokens:
            return self.status(401, "Unauthorized", "Unauthorized")
        found = self.PATH.fullmatch(url.path)
        if not self.crds_installed or found is None or method != "PATCH":
            return 404, "text/plain; charset=utf-8", b"404 page not found\n"
        namespace, name = found.groups()
        if namespace not in self.namespaces:
            return self.status(
                404, "NotFound", f'namespaces "{namespace}" not found', name=namespace, kind="namespaces"
            )
        if headers.get("content-type") != "application/apply-patch+yaml":
            return self.status(415, "UnsupportedMediaType", "the body of the request was in an unknown format")
        if not query.get("fieldManager"):
            return self.status(422, "Invalid", "PatchOptions.meta.k8s.io is invalid: fieldManager: Required value")
        key = f"{namespace}/{name}"
        for verb in ("patch",) if key in self.stored else ("patch", "create"):
            if verb not in self.tokens[token]:
                return self.status(403, "Forbidden", f'httproutes.gateway.networking.k8s.io "{name}" is forbidden: '
                                   f'User "system:serviceaccount:{namespace}:draftwatch-routes" cannot {verb} resource '
                                   f'"httproutes" in API group "gateway.networking.k8s.io" in the namespace '
                                   f'"{namespace}"', name=name, kind="httproutes")  # fmt: skip
        obj = yaml.safe_load(body)  # an apply patch is YAML, JSON included
        if obj["metadata"]["name"] != name:
            return self.status(400, "BadRequest", f"the name of the object ({obj['metadata']['name']}) does not "
                               f"match the name on the URL ({name})")  # fmt: skip
        errors = [e.message for e in SCHEMA.iter_errors(obj)]
        if errors:
            return self.status(422, "Invalid", f'HTTPRoute.gateway.networking.k8s.io "{name}" is invalid: {errors[0]}')
        created = key not in self.stored
        version = str(len(self.requests))
        manager = {"manager": query["fieldManager"][0], "operation": "Apply", "apiVersion": obj["apiVersion"]}
        obj["metadata"].update(resourceVersion=version, managedFields=[manager])
        self.stored[key] = obj
        return 201 if created else 200, "application/json", json.dumps(obj).encode()

    @staticmethod
    def status(code: int, reason: str, message: str, **details: str) -> tuple[int, str, bytes]:
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                  "reason": reason, "code": code, **({"details": details} if details else {})}  # fmt: skip
        return code, "application/json", json.dumps(status).encode()


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    other_ca: Path  # a CA that did not sign the server's certificate


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A cluster CA and the API server's certificate for 127.0.0.1 signed by it, as kubeadm makes them."""
    assert shutil.which("openssl"), "the openssl command makes the test's certificates: apt-get install openssl"
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", *ec, "-keyout", d / f"{ca}.key", "-out", d / f"{ca}.crt", "-days", "2",
                "-subj", f"/CN={ca}", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    openssl("req", *ec, "-keyout", d / "server.key", "-out", d / "server.csr", "-subj", "/CN=kube-apiserver")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", d / "server.csr", "-CA", d / "ca.crt", "-CAkey", d / "ca.key",
            "-out", d / "server.crt", "-days", "2", "-extfile", d / "ext")  # fmt: skip
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "other-ca.crt")


TOKEN: Final = "sa-token-with-the-role"


@pytest.fixture
def api(pki: Pki) -> Iterator[tuple[ApiServer, str]]:
    """The server on a free port over TLS, and its https:// URL."""
    server = ApiServer({TOKEN: {"get", "patch", "create"}, "patch-only": {"get", "patch"}})

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_PATCH(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            headers = {k.lower(): v for k, v in self.headers.items()}
            code, content_type, payload = server.answer(self.command, self.path, headers, body)
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.cert, pki.key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"https://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def kubeconfig(path: Path, server: str, ca: Path, user: dict[str, Any]) -> Path:
    """A kubeconfig as kubectl writes one: the CA inline (base64), the context current."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server,
                      "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}}],
        "users": [{"name": "draftwatch", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "draftwatch", "namespace": "serving"}}],
        "current-context": "test",
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def hermetic(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No cluster configuration from this machine: no kubeconfig, not in a pod; no draftwatch.toml; a fresh HOME."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "DRAFTWATCH_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def export(tmp_path: Path, *args: str) -> int:
    return main(["routes", "export", "--database-url", f"sqlite:///{tmp_path / 'routes.db'}", "--namespace",
                 "serving", *args])  # fmt: skip


def test_apply_creates_the_route_then_updates_it_as_the_api_server_requires(
    api: tuple[ApiServer, str], pki: Pki, hermetic: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, url = api
    config = kubeconfig(hermetic / "kubeconfig", url, pki.ca, {"token": TOKEN})
    engine = create_engine(f"sqlite:///{hermetic / 'routes.db'}")
    upgrade(engine)
    decide(engine, T0, qa="net_loss")
    engine.dispose()

    assert export(hermetic, "--apply", "--kubeconfig", str(config)) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["spec"] == server.stored["serving/draftwatch"]["spec"]
    assert re.fullmatch(rf"draftwatch routes export: HTTPRoute serving/draftwatch created at {url} "
                        r"\(resourceVersion 1, 2 rules\)\n", err)  # fmt: skip
    (request,) = server.requests
    assert request["method"] == "PATCH"
    assert request["path"] == "/apis/gateway.networking.k8s.io/v1/namespaces/serving/httproutes/draftwatch"
    assert request["query"] == {"fieldManager": ["draftwatch"], "force": ["true"]}
    assert request["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert workloads_of(by_name(server.stored["serving/draftwatch"])["plain"]) == ["qa"]

    assert export(hermetic, "--apply", "--kubeconfig", str(config)) == 0
    assert "HTTPRoute serving/draftwatch updated" in capsys.readouterr().err


def test_apply_with_a_candidate_service_carries_the_rollout_s_weights_and_says_so(
    api: tuple[ApiServer, str], pki: Pki, hermetic: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, url = api
    config = kubeconfig(hermetic / "kubeconfig", url, pki.ca, {"token": TOKEN})
    engine = create_engine(f"sqlite:///{hermetic / 'routes.db'}")
    upgrade(engine)
    r = start_rollout(engine, CANARY, rollout_settings(), T0)
    engine.dispose()

    # Without the flag the route weighs no rollout: in that topology the sidecars split.
    assert export(hermetic, "--apply", "--kubeconfig", str(config)) == 0
    assert capsys.readouterr().err.endswith("(resourceVersion 1, 1 rules)\n")
    (rule,) = server.stored["serving/draftwatch"]["spec"]["rules"]
    assert weights(rule) == {"engine": 19, "engine-plain": 1}

    assert export(hermetic, "--apply", "--kubeconfig", str(config), "--candidate-service", "engine-candidate") == 0
    out, err = capsys.readouterr()
    assert err.endswith(f"(resourceVersion 2, 1 rules, rollout {r.id} of {DRAFTER} running at 25 %)\n")
    (rule,) = server.stored["serving/draftwatch"]["spec"]["rules"]
    assert weights(rule) == {"engine": 57, "engine-candidate": 19, "engine-plain": 4}
    assert yaml.safe_load(out)["spec"] == server.stored["serving/draftwatch"]["spec"]


def test_export_says_it_leaves_the_embedded_decoder_s_rollout_out(
    hermetic: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = create_engine(f"sqlite:///{hermetic / 'routes.db'}")
    upgrade(engine)
    r = start_rollout(engine, ProxySettings(), rollout_settings(), T0, embedded=EMBEDDED)
    engine.dispose()
    assert export(hermetic, "--candidate-service", "engine-candidate") == 0
    out, err = capsys.readouterr()
    (rule,) = yaml.safe_load(out)["spec"]["rules"]
    assert weights(rule) == {"engine": 19, "engine-plain": 1}
    assert err == (f"draftwatch routes export: rollout {r.id} of deployment '*' is the embedded decoder's (its current "
                   "drafters: model, ngram), not weighed: every speculative request stays on engine\n")  # fmt: skip


def test_in_a_pod_the_service_account_s_token_and_ca_are_used(
    api: tuple[ApiServer, str], pki: Pki, tmp_path: Path
) -> None:
    server, url = api
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN + "\n")
    shutil.copy(pki.ca, account / "ca.crt")
    port = url.rsplit(":", 1)[1]
    pod = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port, "HOME": str(tmp_path)}
    cluster = find_cluster(None, pod, account)
    assert TOKEN not in repr(cluster)
    status, stored = apply(cluster, render_httproute(SPEC, {}))
    assert status == 201 and stored["metadata"]["managedFields"][0]["manager"] == "draftwatch"
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {TOKEN}"


def refusal(api: tuple[ApiServer, str], pki: Pki, tmp_path: Path, token: str = TOKEN, ca: Path | None = None) -> str:
    config = kubeconfig(tmp_path / "kubeconfig", api[1], ca or pki.ca, {"token": token})
    with pytest.raises(KubeError) as refused:
        apply(find_cluster(config, {}), render_httproute(SPEC, {}))
    message = str(refused.value)
    assert "\n" not in message and token not in message
    return message


def test_a_role_without_create_is_named_as_the_missing_verb(
    api: tuple[ApiServer, str], pki: Pki, tmp_path: Path
) -> None:
    message = refusal(api, pki, tmp_path, token="patch-only")
    assert message.startswith("forbidden (403): RBAC does not let kubeconfig ")
    assert "create httproutes.gateway.networking.k8s.io in namespace 'serving'" in message
    assert "cannot create resource" in message


def test_an_unknown_token_the_missing_crds_and_a_missing_namespace_each_say_what_to_do(
    api: tuple[ApiServer, str], pki: Pki, tmp_path: Path
) -> None:
    server, _ = api
    assert "(401 Unauthorized): the token is missing, expired or revoked" in refusal(api, pki, tmp_path, "stale")
    server.namespaces.clear()
    assert refusal(api, pki, tmp_path) == "namespace 'serving' does not exist (404): create it or pass --namespace"
    server.crds_installed = False
    assert refusal(api, pki, tmp_path).startswith(
        "the API server does not serve gateway.networking.k8s.io/v1 httproutes (404): install the Gateway API CRDs"
    )


def test_a_server_certificate_from_another_ca_is_refused(api: tuple[ApiServer, str], pki: Pki, tmp_path: Path) -> None:
    message = refusal(api, pki, tmp_path, ca=pki.other_ca)
    assert message.startswith(f"cannot reach the Kubernetes API at {api[1]} (")
    assert "CERTIFICATE_VERIFY_FAILED" in message and message.endswith("check the server's certificate-authority")
    assert api[0].requests == []


def test_a_closed_port_is_reported_as_unreachable(pki: Pki, tmp_path: Path) -> None:
    url = f"https://127.0.0.1:{free_port()}"
    config = kubeconfig(tmp_path / "kubeconfig", url, pki.ca, {"token": TOKEN})
    with pytest.raises(KubeError, match=rf"^cannot reach the Kubernetes API at {re.escape(url)} \(.*\): is it up\?$"):
        apply(find_cluster(config, {}), render_httproute(SPEC, {}))


def test_kubeconfigs_it_cannot_use_are_named_with_what_to_do(pki: Pki, tmp_path: Path) -> None:
    plugin = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}}
    config = kubeconfig(tmp_path / "exec", "https://127.0.0.1:6443", pki.ca, plugin)
    with pytest.raises(KubeError, match="user 'draftwatch' authenticates with an exec plugin, which draftwatch does"):
        find_cluster(config, {})
    (tmp_path / "garbled").write_text("clusters: [")
    with pytest.raises(KubeError, match=r"^kubeconfig .*garbled: not YAML"):
        find_cluster(tmp_path / "garbled", {})
    nothing = r"^no cluster configuration: no kubeconfig at .*, and not in a pod .* pass --kubeconfig FILE"
    with pytest.raises(KubeError, match=nothing):
        find_cluster(None, {"HOME": str(tmp_path)})


def test_kubeconfig_s_first_file_is_read_with_a_client_certificate(pki: Pki, tmp_path: Path) -> None:
    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    user = {"client-certificate-data": data(pki.cert), "client-key-data": data(pki.key)}
    config = kubeconfig(tmp_path / "config", "https://127.0.0.1:6443/", pki.ca, user)
    found = find_cluster(None, {"KUBECONFIG": f"{tmp_path / 'absent'}:{config}", "HOME": str(tmp_path)})
    assert found.server == "https://127.0.0.1:6443" and found.token is None
    assert found.source == f"kubeconfig {config}, context 'test'"
    user["client-key-data"] = data(pki.other_ca)  # a certificate where the key should be
    kubeconfig(config, "https://127.0.0.1:6443/", pki.ca, user)
    with pytest.raises(KubeError, match="client-certificate and client-key do not load"):
        find_cluster(config, {})


# The command's failures: one line, an exit status, no traceback


@pytest.mark.parametrize(
    ("args", "status", "line"),
    [
        (["--apply"], 1, "draftwatch routes export: no cluster configuration: no kubeconfig at "),
        (["--name", "Draft_Watch"], 2, "draftwatch routes export: route name 'Draft_Watch': expected a DNS subdomain"),
        (["--baseline-port", "70000"], 2, "draftwatch routes export: baseline service port 70000: expected a port"),
        (["--candidate-service", "engine-plain"], 2, "draftwatch routes export: candidate service 'engine-plain' is"),
        (["--output", "missing/route.yaml"], 1, "draftwatch routes export: --output missing/route.yaml: No such file"),
    ],
)
def test_a_failure_is_one_line_and_an_exit_status(
    args: list[str], status: int, line: str, hermetic: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert export(hermetic, *args) == status
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1


def test_a_bad_share_is_refused_by_the_entry_point_with_the_flag_and_its_value(hermetic: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "monitor.commands", "routes", "export", "--baseline-share", "1.5"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert "argument --baseline-share: '1.5': expected a share between 0 and 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_share_defaults_to_the_holdout_s_and_the_header_to_the_proxy_s(
    hermetic: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DRAFTWATCH_DECODER_HOLDOUT_SHARE", "0.25")
    monkeypatch.setenv("DRAFTWATCH_PROXY_WORKLOAD_HEADER", "X-Team")
    monkeypatch.setenv("DRAFTWATCH_PROXY_DEFAULT_WORKLOAD", "shared")
    engine = create_engine(f"sqlite:///{hermetic / 'routes.db'}")
    upgrade(engine)
    decide(engine, T0, shared="net_loss")
    engine.dispose()
    assert export(hermetic, "--output", "route.yaml") == 0
    route = yaml.safe_load((hermetic / "route.yaml").read_text())
    check_against_crd(route)
    rules = by_name(route)
    assert rules["plain"]["matches"][0]["headers"] == [{"type": "Exact", "name": "X-Team", "value": "shared"}]
    assert weights(rules["speculative"]) == {"engine": 3, "engine-plain": 1}
    assert capsys.readouterr().out == ""
