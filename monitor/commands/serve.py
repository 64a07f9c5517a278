"""``draftwatch serve``: the sidecar API on uvicorn, optionally with the embedded decoder.

Without API tokens the server binds loopback only and refuses anything else, with the reason; with
``--target`` it loads the drafters (``--draft D``, ``--drafter ngram``, or both: a portfolio the controller
chooses from per request), and the candidate drafter a rollout stages beside them (``--candidate-drafter``,
``--candidate-draft``: monitor/api/decoding/staging.py), before it starts listening.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from typing import TYPE_CHECKING, Any

from decoder.candidate import Candidate, parse_candidate
from decoder.cli import add_model_arguments, build_decoder
from decoder.extras import refuse_without
from decoder.models.fetch import FetchError
from monitor.commands.common import add_settings_arguments, argument_type, settings_or_report
from monitor.commands.scheduler_process import SchedulerProcess
from monitor.config import ConfigError
from monitor.proxy.settings import PROXY_KINDS, parse_upstreams
from monitor.settings.masking import quoted

if TYPE_CHECKING:
    from decoder.speculation.speculative import SpeculativeDecoder
    from monitor.config import Settings

log = logging.getLogger(__name__)


def parse_candidate_model(raw: str) -> Candidate | None:
    """``--candidate-draft MODEL``: the candidate drafter ``model:MODEL``."""
    return parse_candidate(f"model:{raw}")


CANDIDATE = argument_type(parse_candidate)
CANDIDATE_MODEL = argument_type(parse_candidate_model)


class PathOnly(logging.Filter):
    """Cuts the query string off uvicorn's access lines: it can carry what should never be logged (a
    token a client put in the URL). Its argument order is uvicorn's, which its own formatter reads too:
    client address, method, path with query, HTTP version, status."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            record.args = (*args[:2], args[2].partition("?")[0], *args[3:])
        return True


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the sidecar API (ingest, metrics; decoding with --target)",
        description="Serve the sidecar API: POST /v1/events (and the vllm, llamacpp, sglang adapters), "
        "/v1/workloads, /metrics, /healthz, /readyz; with --target also /v1/generate and "
        "/v1/chat/completions; with --upstream URL (proxy mode) it forwards a serving stack's endpoints "
        "(/v1/chat/completions, /v1/completions, /v1/responses, /v1/models, /completion, /generate) and records "
        "every request. The database comes from DRAFTWATCH_DATABASE_URL, tokens from DRAFTWATCH_API_TOKENS.",
    )
    parser.add_argument("--host", default=None, help="address to bind (default: api.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port to bind (default: api.port, 8321)")
    add_settings_arguments(parser)
    # Read as the settings read them (comma-separated, checked whole) in _serve, not by argparse: a bad
    # URL is then one line naming the flag, not the usage text.
    parser.add_argument(
        "--upstream",
        default=None,
        metavar="URL",
        action="append",
        help="proxy mode: forward to this serving stack, e.g. http://127.0.0.1:8080; several (repeated, or "
        "comma-separated) make a pool balanced by least outstanding requests (default: proxy.upstream)",
    )
    parser.add_argument(
        "--baseline-upstream",
        default=None,
        metavar="URL",
        action="append",
        help="the same model served WITHOUT speculation: the plain baseline that measures, per workload, whether "
        "speculation pays (the verdict in /v1/workloads, the drift run's net_loss, the dashboard); repeatable or "
        "comma-separated (default: proxy.baseline_upstream; see proxy.baseline_policy and proxy.on_net_loss)",
    )
    parser.add_argument(
        "--candidate-upstream",
        default=None,
        metavar="URL",
        action="append",
        help="the same target served with a NEW drafter: the candidate pool a rollout (draftwatch rollout start) "
        "gives a rising share of the speculative traffic, judged per workload against --upstream; repeatable or "
        "comma-separated (default: proxy.candidate_upstream)",
    )
    parser.add_argument(
        "--upstream-kind",
        choices=PROXY_KINDS,
        default=None,
        help="the upstream's stack, how its speculative counts are read (default: proxy.kind, auto)",
    )
    parser.add_argument(
        "--no-scheduler",
        action="store_true",
        help="do not run the drift/alert scheduler (by default a child process of this one; run `draftwatch scheduler` "
        "elsewhere)",
    )
    add_model_arguments(parser)
    candidate = parser.add_mutually_exclusive_group()
    candidate.add_argument(
        "--candidate-drafter",
        type=CANDIDATE,
        default=None,
        metavar="DRAFTER",
        help="with --target: a NEW drafter beside --draft/--drafter that a rollout (draftwatch rollout start) gives "
        "a rising share of the requests, judged per workload against them: ngram:MIN-MAX (prompt lookup of MIN- to "
        "MAX-grams, e.g. ngram:1-2) or model:MODEL (default: decoder.candidate)",
    )
    candidate.add_argument(
        "--candidate-draft",
        type=CANDIDATE_MODEL,
        default=None,
        dest="candidate_drafter",
        metavar="MODEL",
        help="with --target: a NEW draft model as the rollout's candidate drafter, same forms as --draft "
        "(--candidate-drafter model:MODEL)",
    )
    # Decoding is optional here: no --target means an ingest-and-report sidecar.
    parser.set_defaults(handler=_serve, target=None)


def mode_of(settings: Settings, decoder: SpeculativeDecoder | None) -> str:
    """What this sidecar does, for its banner: the embedded decoder, proxy mode (with or without a baseline), ingest."""
    if decoder is not None:
        staged = f", candidate drafter {settings.decoder.candidate} for a rollout" if decoder.candidate else ""
        return f"embedded decoder: {decoder.target.name}{staged}"
    proxy = settings.proxy
    if not proxy.upstream:
        return "ingest only: POST /v1/events and the adapters" + (", scrape mode" if settings.scrape.targets else "")
    pool = f"proxy mode: {len(proxy.upstream)} speculative upstream(s)"
    if proxy.routes:
        pool += f", {len(proxy.routes)} model route(s)"
    if proxy.candidate_upstream:
        pool += f", {len(proxy.candidate_upstream)} candidate drafter upstream(s) for a rollout"
    if not proxy.baseline_upstream:
        return pool + ", no plain baseline (speedup not measured; add --baseline-upstream)"
    return (f"{pool}, {len(proxy.baseline_upstream)} plain baseline(s) by {proxy.baseline_policy}, "
            f"on a net loss: {proxy.on_net_loss}")  # fmt: skip


def _upstreams(flag: str, given: list[str] | None) -> tuple[str, ...] | None:
    """The URLs of a repeated ``flag``, each value in the forms of its setting; None when it was not given.

    >>> _upstreams("--upstream", ["http://a:1,http://b:2/", "http://c:3"])
    ('http://a:1', 'http://b:2', 'http://c:3')
    >>> _upstreams("--upstream", ["http://ada:s3cret@a:99999"])
    Traceback (most recent call last):
    ...
    monitor.settings.parsers.ConfigError: --upstream='http://ada:***@a:99999': port 99999: expected a port 1-65535
    """
    if given is None:
        return None
    urls: list[str] = []
    for raw in given:
        try:
            found = parse_upstreams(raw)
        except ValueError as error:
            raise ConfigError(f"{flag}={quoted(raw)}: {error}") from None
        if not found:
            raise ConfigError(f"{flag}={quoted(raw)}: expected a base URL, such as http://127.0.0.1:8080")
        urls += found
    if len(set(urls)) != len(urls):
        raise ConfigError(f"{flag}: expected each base URL once, got {quoted(urls)}")
    return tuple(urls)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from monitor.api.app import create_app
    from monitor.api.auth import check_bind, check_tokens
    from monitor.api.server import GracefulServer, uvicorn_options

    try:
        upstream = _upstreams("--upstream", args.upstream)
        baseline_upstream = _upstreams("--baseline-upstream", args.baseline_upstream)
        candidate_upstream = _upstreams("--candidate-upstream", args.candidate_upstream)
    except ConfigError as error:
        print(f"draftwatch serve: {error}", file=sys.stderr)
        return 2
    overrides = {
        "api.host": args.host,
        "api.port": args.port,
        "proxy.upstream": upstream,
        "proxy.baseline_upstream": baseline_upstream,
        "proxy.candidate_upstream": candidate_upstream,
        "decoder.candidate": args.candidate_drafter,
    }
    settings = settings_or_report(args, "serve", {**overrides, "proxy.kind": args.upstream_kind})
    if settings is None:
        return 2
    for flag, given in (("--baseline-upstream", settings.proxy.baseline_upstream),
                        ("--candidate-upstream", settings.proxy.candidate_upstream)):  # fmt: skip
        if given and not settings.proxy.upstream:
            print(f"draftwatch serve: {flag} needs --upstream (the speculative stack it is compared with)",
                  file=sys.stderr)  # fmt: skip
            return 2
    if settings.proxy.has_candidate and not settings.proxy.upstream_is_current_pool:
        print(f"draftwatch serve: proxy.speculative={settings.proxy.speculative} with a candidate drafter: a "
              "candidate is judged against the speculative pool behind --upstream, which this setting says is not "
              "speculative; leave proxy.speculative at auto or set it to true", file=sys.stderr)  # fmt: skip
        return 2
    if settings.proxy.baseline_beside and not settings.proxy.upstream_is_current_pool:
        print(f"draftwatch serve: proxy.speculative={settings.proxy.speculative} with a plain baseline: the baseline "
              "declares the pool behind --upstream speculative (its requests are compared with the baseline's); "
              "leave proxy.speculative at auto or set it to true", file=sys.stderr)  # fmt: skip
        return 2
    if settings.proxy.routes and not settings.proxy.upstream:
        print("draftwatch serve: proxy.routes needs --upstream (proxy.upstream), the pool of the models no route "
              "matches", file=sys.stderr)  # fmt: skip
        return 2
    if settings.proxy.upstream and args.target is not None:
        print("draftwatch serve: --upstream (proxy mode) and --target (the embedded decoder) exclude each other",
              file=sys.stderr)  # fmt: skip
        return 2
    refusal = check_tokens(settings.api.tokens) or check_bind(settings.api.host, bool(settings.api.tokens))
    if refusal is not None:
        print(f"draftwatch serve: {refusal}", file=sys.stderr)
        return 2
    if args.target is None and (args.draft or args.drafter or args.candidate_drafter):
        print("draftwatch serve: --draft/--drafter/--candidate-drafter/--candidate-draft need --target",
              file=sys.stderr)  # fmt: skip
        return 2
    decoder: SpeculativeDecoder | None = None
    if args.target is not None:
        if (refused := refuse_without("draftwatch serve --target", "decoder")) is not None:
            return refused
        from decoder.models.loading import ModelLoadError

        try:
            decoder = build_decoder(args, progress=sys.stderr.isatty(), candidate=settings.decoder.candidate)
        except (ModelLoadError, FetchError, ValueError) as error:
            print(f"draftwatch serve: {error}", file=sys.stderr)
            return 1
    # Any number of sidecars may run it: the lease elects one leader among them. In a process of its own, its
    # ticks never hold the proxy's event loop (monitor/commands/scheduler_process.py).
    scheduler = None if args.no_scheduler else SchedulerProcess(settings).start()
    app = create_app(settings, decoder=decoder)
    print(
        f"draftwatch serve: listening on http://{settings.api.host}:{settings.api.port} ({mode_of(settings, decoder)}, "
        f"{'token auth' if settings.api.tokens else 'no auth, loopback only'}, "
        f"{'scheduler in a child process' if scheduler else 'no scheduler'})",
        file=sys.stderr,
        flush=True,
    )
    # Access lines carry method, path and status only: no query, no bodies, no Authorization header.
    # uvicorn's logging setup replaces the logger's handlers but keeps its filters.
    logging.getLogger("uvicorn.access").addFilter(PathOnly())
    # What is imported and built by now lives as long as the process: frozen, the collector's full passes
    # no longer walk it (under proxied load they took 85-120 ms each, 10-13 ms frozen: the proxy's p99).
    gc.freeze()
    try:
        config = uvicorn.Config(
            app,
            host=settings.api.host,
            port=settings.api.port,
            log_level=logging.getLevelName(logging.getLogger().level).lower(),
            access_log=logging.getLogger().level <= logging.INFO,
            **uvicorn_options(settings.api),
        )
        GracefulServer(config, app, settings.api).run()
    finally:
        if scheduler is not None:
            scheduler.stop()
    return 0
