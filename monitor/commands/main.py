"""The one console entry point, ``draftwatch``, assembled from each part's sub-commands.

Each command group lives beside the code it drives and exposes ``register(subparsers)``; the
registered handler receives the parsed arguments and returns the process exit status.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from importlib import import_module
from importlib.metadata import version

# Modules that contribute sub-commands, in the order `--help` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "decoder.cli",
    "monitor.commands.evaluate.command",
    "monitor.commands.capture",
    "monitor.commands.db",
    "monitor.commands.serve",
    "monitor.commands.drift",
    "monitor.commands.ledger",
    "monitor.commands.routes",
    "monitor.commands.rollout",
    "monitor.commands.alerts",
    "monitor.commands.config",
    "dashboard.cli",
    "monitor.commands.demo",
)

Handler = Callable[[argparse.Namespace], int]
# The HTTP client logs every request's full URL at INFO: a webhook's path can be its credential
# (Slack's is). Delivery logs what matters (receiver, host, outcome) itself.
QUIET_LOGGERS: tuple[str, ...] = ("httpx", "httpcore")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftwatch",
        description="Monitoring and drift detection for speculative decoding.",
    )
    parser.add_argument("--version", action="version", version=f"draftwatch {version('draftwatch')}")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="verbosity of the logs written to stderr (default: %(default)s)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        import_module(module_name).register(subparsers)
    return parser


def configure_logging(level: str) -> None:
    """Logs to stderr at ``level``; the HTTP client's loggers stay at WARNING whatever the level."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
