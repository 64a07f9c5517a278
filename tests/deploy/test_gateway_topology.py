"""The Gateway API topology as deploy/ renders it: the gateway splits, a sidecar records in front of each pool.

deploy/gateway-fleet is ../fleet, ../gateway (the CronJob applying ``draftwatch routes export``) and the
component deploy/components/gateway-sidecars. The route the CronJob applies holds out the baseline's share;
each sidecar's own router, built from the settings its container is given, must then send nothing of its
own to the baseline, or the holdout is counted twice (as it is when ../gateway is combined with ../fleet
alone, checked here too). The rest of deploy/'s checks (strict schemas, images, probes, tokens, disruption
budgets, the shutdown's grace period) run on this overlay in test_manifests.py.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path

import pytest

from monitor.commands.main import build_parser
from monitor.config import Settings
from monitor.proxy.routing import Router, build_router
from tests.deploy.test_manifests import (
    DEPLOY,
    GATEWAY_TOPOLOGIES,
    Object,
    container_port,
    draftwatch_containers,
    named,
    render,
    resolved_env,
    selected,
)

DRAWS = 2000
# A sidecar's settings, and where its own router sent DRAWS requests of each workload (sidecar_draws).
Drawn = dict[str, tuple[Settings, dict[str, Counter[str | None]]]]


def cron_container(objects: tuple[Object, ...]) -> Object:
    [cronjob] = named(objects, "CronJob").values()
    [container] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return container


def settings_of(objects: tuple[Object, ...], container: Object, home: Path) -> Settings:
    return Settings.from_env({"HOME": str(home), **resolved_env(objects, container)}, None)


def recording_sidecars(objects: tuple[Object, ...], home: Path) -> dict[str, Settings]:
    """Every draftwatch container in proxy mode, by ``Deployment/container``, with the settings it starts with."""
    return {
        f"{deployment['metadata']['name']}/{container['name']}": settings_of(objects, container, home)
        for deployment, _, container in draftwatch_containers(objects)
        if "DRAFTWATCH_PROXY_UPSTREAM" in resolved_env(objects, container)
    }


def baseline_draws(router: Router, workload: str) -> Counter[str | None]:
    """Where ``DRAWS`` requests of a workload go: the holdout reason of each (None: the pool behind --upstream)."""
    return Counter(router.choose(workload).holdout_reason for _ in range(DRAWS))


def sidecar_draws(objects: tuple[Object, ...], home: Path) -> Drawn:
    """Every recording sidecar's settings, with where its own router sends an unrouted and a routed workload's
    requests (the gateway's probe share of a routed workload reaches a sidecar too)."""
    found: Drawn = {}
    for where, settings in recording_sidecars(objects, home).items():
        router = build_router(settings, seed=1)
        try:
            router.routed = frozenset({"routed"})
            found[where] = settings, {w: baseline_draws(router, w) for w in ("unrouted", "routed")}
        finally:
            asyncio.run(router.aclose())
    return found


def second_holdouts(sidecars: Drawn) -> dict[str, Counter[str | None]]:
    """Of ``sidecar_draws``, the sidecars that send requests of their own to a baseline, with where both workloads'
    went. A sidecar whose upstream is the baseline is left out: every answer there is the gateway's holdout (or its
    routed workload), counted once."""
    found = {}
    for where, (settings, draws) in sidecars.items():
        both = draws["unrouted"] + draws["routed"]
        if not settings.proxy.upstream_is_baseline and set(both) != {None}:
            found[where] = both
    return found


@pytest.mark.parametrize("overlay", GATEWAY_TOPOLOGIES)
def test_the_route_s_services_reach_a_recording_sidecar_in_front_of_each_pool(overlay: str, tmp_path: Path) -> None:
    objects = render(overlay)
    container = cron_container(objects)
    args = build_parser().parse_args(container["command"][1:])
    assert not args.no_baseline, f"deploy/{overlay}: the route holds out nothing"
    services = named(objects, "Service")
    pools = {"speculative": (args.speculative_service, args.speculative_port),
             "baseline": (args.baseline_service, args.baseline_port)}  # fmt: skip
    for pool, (name, number) in pools.items():
        assert name in services, f"deploy/{overlay}: the route's {pool} Service {name} is not rendered"
        service = services[name]
        [port] = [p for p in service["spec"]["ports"] if p["port"] == number]
        pods = selected(objects, service["spec"]["selector"])
        assert pods, f"deploy/{overlay}: Service {name} selects no pods"
        for spec in pods:
            sidecars = [c for d, s, c in draftwatch_containers(objects) if s is spec]
            assert len(sidecars) == 1, f"deploy/{overlay}: the {pool} pods behind {name} have no sidecar"
            settings = settings_of(objects, sidecars[0], tmp_path)
            assert container_port(spec, port["targetPort"]) == settings.api.port, (
                f"deploy/{overlay}: Service {name} sends the gateway's requests past the sidecar"
            )
            declared = settings.proxy.speculative
            assert declared == ("true" if pool == "speculative" else "baseline"), (
                f"deploy/{overlay}: the sidecar in front of {name} declares proxy.speculative={declared}"
            )


@pytest.mark.parametrize("overlay", GATEWAY_TOPOLOGIES)
def test_only_the_gateway_holds_out(overlay: str, tmp_path: Path) -> None:
    objects = render(overlay)
    route = settings_of(objects, cron_container(objects), tmp_path)
    assert route.decoder.holdout_share > 0
    sidecars = sidecar_draws(objects, tmp_path)
    assert {s.proxy.speculative for s, _ in sidecars.values()} == {"true", "baseline"}
    assert second_holdouts(sidecars) == {}, f"deploy/{overlay}: a sidecar holds out a second share"
    for where, (settings, draws) in sidecars.items():
        if settings.proxy.upstream_is_baseline:
            assert draws == {"unrouted": {"share": DRAWS}, "routed": {"route": DRAWS}}, where


def test_gateway_and_fleet_without_the_component_hold_out_twice(tmp_path: Path) -> None:
    """The combination the component exists for: the fleet's sidecars keep their baseline beside them."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    bases = [os.path.relpath(DEPLOY / base, overlay) for base in ("fleet", "gateway")]  # kustomize refuses absolute
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n"
        + "".join(f"  - {base}\n" for base in bases)
    )
    found = second_holdouts(sidecar_draws(render(str(overlay)), tmp_path))
    # The fleet's sidecar holds out its own share of the unrouted workload beside the gateway's.
    assert set(found) == {"engine/draftwatch"} and found["engine/draftwatch"]["share"] > 0, found


@pytest.mark.parametrize("overlay", GATEWAY_TOPOLOGIES)
def test_the_scheduler_decides_the_route_from_the_store_both_pools_write(overlay: str, tmp_path: Path) -> None:
    """The scheduler routes a net loss only where a baseline is declared; the CronJob exports its decisions from
    the database every sidecar writes to, matching requests on the header the sidecars read the workload from."""
    objects = render(overlay)
    [scheduler] = [c for d, _, c in draftwatch_containers(objects) if d["metadata"]["name"] == "draftwatch-scheduler"]
    settings = settings_of(objects, scheduler, tmp_path)
    assert settings.proxy.on_net_loss == "route" and settings.proxy.has_baseline

    def database(container: Object) -> object:
        [ref] = [e["valueFrom"] for e in container["env"] if e["name"] == "DRAFTWATCH_DATABASE_URL"]
        return ref

    cron = cron_container(objects)
    sidecars = [
        c for _, _, c in draftwatch_containers(objects) if "DRAFTWATCH_PROXY_UPSTREAM" in resolved_env(objects, c)
    ]
    assert {str(database(c)) for c in [scheduler, cron, *sidecars]} == {str(database(cron))}
    route = settings_of(objects, cron, tmp_path).proxy
    for sidecar in sidecars:
        proxy = settings_of(objects, sidecar, tmp_path).proxy
        assert (proxy.workload_header, proxy.default_workload) == (route.workload_header, route.default_workload)


@pytest.mark.parametrize("overlay", GATEWAY_TOPOLOGIES)
def test_the_plain_pods_sidecar_is_the_speculative_pods_but_for_its_declared_pool(overlay: str) -> None:
    """The component writes the plain pods' sidecar out again (kustomize cannot copy a container between
    Deployments): it must stay the speculative pods' one, its probes, limits, shutdown and settings, but for
    ``DRAFTWATCH_PROXY_SPECULATIVE``."""
    objects = render(overlay)
    sidecars = {deployment["metadata"]["name"]: (pod, container)
                for deployment, pod, container in draftwatch_containers(objects)
                if deployment["metadata"]["name"] in ("engine", "engine-plain")}  # fmt: skip
    assert set(sidecars) == {"engine", "engine-plain"}

    def shape(pod: Object, container: Object) -> tuple[Object, dict[str, object], object]:
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}
        env.pop("DRAFTWATCH_PROXY_SPECULATIVE")
        rest = {k: v for k, v in container.items() if k != "env"}
        return rest, env, pod.get("terminationGracePeriodSeconds")

    speculative, plain = (shape(*sidecars[name]) for name in ("engine", "engine-plain"))
    assert plain == speculative
