"""``draftwatch config show``: the effective settings, where each came from, secrets masked."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from monitor.commands.common import add_config_argument, config_file, settings_or_report
from monitor.commands.settings_doc import format_default
from monitor.config import ConfigError, Settings, all_specs, sources
from monitor.settings.masking import mask_urls

MASK = "*** (set)"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "config",
        help="show the effective settings and where each came from",
        description="Settings come from the environment (DRAFTWATCH_*), then draftwatch.toml ($DRAFTWATCH_CONFIG "
        "or ./draftwatch.toml), then the defaults. `config show` prints each setting's value as a service "
        "started here would resolve it, and its source; secrets (tokens, webhook secrets, URL passwords) are masked.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="print every setting, its value and its source (secrets masked)")
    add_config_argument(show)
    show.add_argument("--json", action="store_true", help="one JSON object per setting, as a list")
    show.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    settings = settings_or_report(args, "config show")
    if settings is None:
        return 2
    try:
        found = sources(os.environ, config_file(args))
    except ConfigError as error:
        print(f"draftwatch config show: {error}", file=sys.stderr)
        return 2
    rows = []
    for path, spec in all_specs():
        value = _value(settings, path)
        # Not only the secrets: any URL may carry user:password@ (an upstream's, the database's).
        shown = MASK if spec.secret and value else mask_urls(format_default(value))
        rows.append({"setting": spec.name, "value": shown, "source": found[spec.name], "env": spec.env})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["setting"]) for r in rows)
    source_width = max(len(r["source"]) for r in rows)
    for r in rows:
        print(f"{r['setting']:<{width}}  {r['source']:<{source_width}}  {r['value']}")
    return 0


def _value(settings: Settings, path: tuple[str, ...]) -> Any:
    value: Any = settings
    for part in path:
        value = getattr(value, part)
    return value
