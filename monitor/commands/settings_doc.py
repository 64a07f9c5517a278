"""The configuration reference: every setting, its environment variable and default, as a Markdown table.

docs/configuration.md embeds this table between ``<!-- settings:start -->`` and ``<!-- settings:end -->``;
a test regenerates it and fails when the two differ, so the documentation never goes stale.
Regenerate with ``python -m monitor.commands.settings_doc``.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from monitor.config import Settings, all_specs
from monitor.settings.parsers import format_duration

# Defaults are resolved against a neutral home, so the table reads the same on every machine.
_NEUTRAL_ENVIRONMENT = {"HOME": "~"}


def format_default(value: Any) -> str:
    """A setting's default as the table shows it.

    >>> format_default(timedelta(minutes=5)), format_default(()), format_default(True)
    ('5m', '(none)', 'true')
    """
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, tuple | list):
        if not value:
            return "(none)"
        if all(hasattr(item, "name") for item in value):
            return f"{len(value)} built-in rules"
        return ", ".join(str(item) for item in value)
    if isinstance(value, Path):
        return str(value)
    return str(value)


def settings_table() -> str:
    defaults = Settings.from_env(_NEUTRAL_ENVIRONMENT)
    lines = [
        "| setting (`draftwatch.toml`) | environment variable | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for path, spec in all_specs():
        value: Any = defaults
        for attribute in path:
            value = getattr(value, attribute)
        meaning = spec.help.replace("|", "\\|")
        default = format_default(value).replace("|", "\\|")
        # A renamed variable is still read (with a warning), so the table says which old name it answers to.
        was = "".join(f" (was `{old}`)" for old in spec.renamed_from)
        lines.append(f"| `{spec.name}` | `{spec.env}`{was} | `{default}` | {meaning} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(settings_table())
