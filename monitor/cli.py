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

# Modules that contribute sub-commands, in the order `--help` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "decoder.cli",
    "monitor.db.cli",
    "monitor.api.cli",
    "monitor.drift.cli",
    "monitor.alerts.cli",
    "dashboard.cli",
    "monitor.demo.cli",
)

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftwatch",
        description="Monitoring and drift detection for speculative decoding.",
    )
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
