"""The store's settings: which database, and whether a service migrates it when it starts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from monitor.settings.fields import setting
from monitor.settings.parsers import parse_bool, parse_str


def parse_database_url(raw: Any) -> str:
    url = parse_str(raw)
    if not url.startswith(("sqlite:", "postgresql:", "postgresql+", "postgres:")):
        raise ValueError("expected a sqlite:/// or postgresql+psycopg:// URL")
    return url


@dataclass(frozen=True, slots=True, kw_only=True)
class DatabaseSettings:
    url: str = setting(
        "database.url",
        parse_database_url,
        dataclasses.MISSING,
        "SQLAlchemy URL: sqlite:///PATH or postgresql+psycopg://USER@HOST/DB (default: draftwatch.db in data_dir)",
        derive=lambda data_dir: f"sqlite:///{data_dir / 'draftwatch.db'}",
    )
    upgrade_on_start: bool = setting(
        "database.upgrade_on_start",
        parse_bool,
        True,
        "run the schema migrations when a service starts",
    )
