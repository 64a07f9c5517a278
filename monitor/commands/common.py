"""What every database-backed sub-command shares: ``--config``/``--database-url``, settings, an engine.

One place decides how a command reads its settings (environment, then ``draftwatch.toml``, then
the command line) and how it reports a failure (one line on stderr, the traceback in the debug log).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from monitor.config import ConfigError, Settings, default_config_file, unknown_variables

if TYPE_CHECKING:  # the database layer loads when a command runs, not when --help is read
    from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)

Action: TypeAlias = "Callable[[Engine, Settings], int]"
T = TypeVar("T")


def argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """A setting's parser as an argparse ``type``: its ValueError becomes argparse's one-line usage error.

    >>> argument_type(int)("7")
    7
    >>> from monitor.settings.parsers import parse_share
    >>> argument_type(parse_share)("2")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: '2': expected a share between 0 and 1
    """

    def parsed(text: str) -> T:
        try:
            return parse(text)
        except ValueError as error:
            said = str(error)  # quoting the value, unless the parser's message already does
            raise argparse.ArgumentTypeError(said if repr(text) in said else f"{text!r}: {said}") from None

    parsed.__name__ = getattr(parse, "__name__", "value")  # argparse names the type in its message
    return parsed


def iso_time(text: str) -> datetime:
    """An argparse ``type`` for a window's end: an ISO time, UTC where it names no zone.

    >>> iso_time("2026-03-01T12:00").isoformat()
    '2026-03-01T12:00:00+00:00'
    """
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an ISO time like 2026-03-01T12:00") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    """``--config``, for a command that needs no database."""
    parser.add_argument(
        "--config", type=Path, default=None, help="draftwatch.toml to read (default: $DRAFTWATCH_CONFIG or ./)"
    )


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` and ``--database-url``."""
    add_config_argument(parser)
    parser.add_argument("--database-url", default=None, help="overrides DRAFTWATCH_DATABASE_URL and the config file")


def config_file(args: argparse.Namespace) -> Path | None:
    return getattr(args, "config", None) or default_config_file(os.environ, Path.cwd())


def settings_from_args(args: argparse.Namespace, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Settings from the environment and the config file, with ``--database-url`` and ``overrides`` on top.

    ``overrides`` maps dotted setting names to typed values; those whose value is ``None`` are left
    out, so optional flags can be passed straight through.
    """
    settings = Settings.from_env(os.environ, config_file(args))
    for warning in unknown_variables(os.environ):
        print(f"draftwatch: warning: {warning}", file=sys.stderr)
    changes = {"database.url": getattr(args, "database_url", None), **(overrides or {})}
    return settings.with_values({key: value for key, value in changes.items() if value is not None})


def settings_or_report(
    args: argparse.Namespace, command: str, overrides: Mapping[str, Any] | None = None
) -> Settings | None:
    """:func:`settings_from_args`, or None after telling the user on stderr what is wrong (exit status 2)."""
    try:
        return settings_from_args(args, overrides)
    except ConfigError as error:
        print(f"draftwatch {command}: {error}", file=sys.stderr)
        return None


def run_with_engine(args: argparse.Namespace, command: str, action: Action, *, upgrade: bool = True) -> int:
    """Build settings and an engine, bring the schema up to date (``upgrade``), run ``action``.

    Exit status: ``action``'s, 2 for bad settings, 1 when ``action`` raised.
    """
    settings = settings_or_report(args, command)
    if settings is None:
        return 2
    from monitor.store import migrate
    from monitor.store.engine import create_engine

    engine = None
    try:
        engine = create_engine(settings.database.url)
        if upgrade and settings.database.upgrade_on_start:
            migrate.upgrade(engine, database=settings.database)
        return int(action(engine, settings))
    except Exception as error:  # the CLI reports, the log keeps the traceback
        log.debug("draftwatch %s failed", command, exc_info=True)
        print(f"draftwatch {command}: {type(error).__name__}: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        if engine is not None:
            engine.dispose()
