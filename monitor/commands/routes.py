"""``draftwatch routes export [--apply]``: the routing decisions as a Gateway API HTTPRoute, for a gateway to act on."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from monitor.commands.common import add_settings_arguments, argument_type, run_with_engine
from monitor.config import Settings
from monitor.settings.parsers import parse_share

if TYPE_CHECKING:  # the database layer loads when the command runs, not when --help is read
    from sqlalchemy.engine import Engine

COMMAND = "routes export"
# The Services of deploy/base: the engine's pods with the sidecar in front (engine.yaml) and the plain baseline.
SPECULATIVE_SERVICE = "engine"
BASELINE_SERVICE = "engine-plain"
SERVICE_PORT = 80

SHARE = argument_type(parse_share)


def register(subparsers: Any) -> None:
    """Add the ``routes`` command group."""
    routes = subparsers.add_parser("routes", help="the routing decisions as a gateway's configuration")
    routes.set_defaults(handler=lambda _args: (routes.print_help(), 2)[1])
    commands = routes.add_subparsers(dest="routes_command", metavar="ROUTES_COMMAND")
    export = commands.add_parser(
        "export",
        help="render the decisions as a Gateway API HTTPRoute; --apply patches it into the cluster",
        description="Print the HTTPRoute (gateway.networking.k8s.io/v1) that routes each workload as draftwatch "
        "decided: by the workload header (proxy.workload_header), a workload routed to plain to the baseline "
        "Service but for a probe share, every other one to the speculative Service with the holdout share to "
        "the baseline. With --candidate-service, a running or promoted rollout of the default deployment (draftwatch "
        "rollout start without --route; a proxy's, not an embedded decoder's) splits the speculative weight as its "
        "step says, per workload where it kept or promoted one: run it again as the steps advance (deploy/gateway's "
        "CronJob does, every 5 minutes). --apply sends it to the Kubernetes API (server-side apply, field manager "
        "draftwatch).",
    )
    add_settings_arguments(export)
    export.add_argument("--name", default="draftwatch", help="the HTTPRoute's name (default: %(default)s)")
    export.add_argument("--namespace", default="default", help="its namespace and the Services' (default: %(default)s)")
    export.add_argument("--gateway", default="inference-gateway", help="the parent Gateway (default: %(default)s)")
    export.add_argument("--gateway-namespace", default=None, help="the Gateway's namespace (default: the route's)")
    export.add_argument("--gateway-section", default=None, help="the Gateway listener's name (default: all)")
    export.add_argument("--speculative-service", default=SPECULATIVE_SERVICE,
                        help="Service of the speculative pool (default: %(default)s)")  # fmt: skip
    export.add_argument("--speculative-port", type=int, default=SERVICE_PORT, help="its port (default: %(default)s)")
    export.add_argument("--baseline-service", default=BASELINE_SERVICE,
                        help="Service of the plain baseline (default: %(default)s)")  # fmt: skip
    export.add_argument("--baseline-port", type=int, default=SERVICE_PORT, help="its port (default: %(default)s)")
    export.add_argument("--candidate-service", default=None,
                        help="Service of the candidate pool (the same target with the new drafter): the active "
                             "rollout's share of the speculative weight goes there (default: none, no rollout is "
                             "weighed: the sidecars split, if they have the candidate pool)")  # fmt: skip
    export.add_argument("--candidate-port", type=int, default=SERVICE_PORT, help="its port (default: %(default)s)")
    export.add_argument("--no-baseline", action="store_true",
                        help="no plain baseline: everything to the speculative Service")  # fmt: skip
    export.add_argument("--baseline-share", type=SHARE, default=None,
                        help="share of a workload's requests sent to the baseline, and of a routed workload's "
                             "kept on speculation as probes (default: decoder.holdout_share)")  # fmt: skip
    export.add_argument("--output", type=Path, default=None, help="write the YAML here (default: stdout)")
    export.add_argument("--apply", action="store_true", help="server-side apply it through the Kubernetes API")
    export.add_argument("--kubeconfig", type=Path, default=None,
                        help="kubeconfig to use (default: in a pod its service account, else $KUBECONFIG or "
                             "~/.kube/config)")  # fmt: skip
    export.set_defaults(handler=_export)


def _export(args: argparse.Namespace) -> int:
    from monitor.gateways.httproute import RouteSpec, Service, render_httproute, to_yaml
    from monitor.gateways.kube import KubeError, apply, find_cluster
    from monitor.proxy.rollout import deployment_of
    from monitor.store.rollouts import active_rollouts
    from monitor.store.routing import latest_routing

    def action(engine: Engine, settings: Settings) -> int:
        candidate = None if args.candidate_service is None else Service(args.candidate_service, args.candidate_port)
        try:
            spec = RouteSpec(
                name=args.name,
                namespace=args.namespace,
                gateway=args.gateway,
                gateway_namespace=args.gateway_namespace,
                gateway_section=args.gateway_section,
                speculative=Service(args.speculative_service, args.speculative_port),
                baseline=None if args.no_baseline else Service(args.baseline_service, args.baseline_port),
                baseline_share=settings.decoder.holdout_share if args.baseline_share is None else args.baseline_share,
                workload_header=settings.proxy.workload_header,
                default_workload=settings.proxy.default_workload,
                candidate=candidate,
            )
        except ValueError as error:
            print(f"draftwatch {COMMAND}: {error}", file=sys.stderr)
            return 2
        try:
            # The route sends every model to one speculative Service: the default deployment's, and its rollout.
            default = deployment_of(settings.proxy, None).deployment
            rollout = active_rollouts(engine).get(default) if spec.candidate else None
            if rollout is not None and not rollout.of_proxy:
                print(f"draftwatch {COMMAND}: rollout {rollout.id} of deployment {rollout.deployment!r} is the "
                      f"embedded decoder's (its current drafters: {', '.join(rollout.current_drafters)}), not "
                      f"weighed: every speculative request stays on {spec.speculative.name}",
                      file=sys.stderr)  # fmt: skip
                rollout = None
            route = render_httproute(spec, latest_routing(engine), rollout)
        except ValueError as error:
            print(f"draftwatch {COMMAND}: {error}", file=sys.stderr)
            return 1
        text = to_yaml(route)
        if args.output is None:
            sys.stdout.write(text)
        else:
            try:
                args.output.write_text(text)
            except OSError as error:
                print(f"draftwatch {COMMAND}: --output {args.output}: {error.strerror}", file=sys.stderr)
                return 1
        if not args.apply:
            return 0
        try:
            cluster = find_cluster(args.kubeconfig)
            status, stored = apply(cluster, route)
        except KubeError as error:
            print(f"draftwatch {COMMAND}: {error}", file=sys.stderr)
            return 1
        done = "created" if status == 201 else "updated"
        version = stored.get("metadata", {}).get("resourceVersion", "?")
        rules = len(route["spec"]["rules"])
        weighed = "" if rollout is None else (f", rollout {rollout.id} of {rollout.drafter} {rollout.status} at "
                                              f"{100 * rollout.step_share:g} %")  # fmt: skip
        print(f"draftwatch {COMMAND}: HTTPRoute {spec.namespace}/{spec.name} {done} at {cluster.server} "
              f"(resourceVersion {version}, {rules} rules{weighed})", file=sys.stderr)  # fmt: skip
        return 0

    return run_with_engine(args, COMMAND, action)
