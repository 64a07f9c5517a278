"""The store's settings: which database, whether a service migrates it when it starts, and its partitions."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from monitor.settings.fields import setting
from monitor.settings.parsers import parse_bool, parse_int, parse_str


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
    partition_days: int = setting(
        "database.partition_days",
        parse_int(1, 366),
        1,
        "days of requests per partition on PostgreSQL (monitor/store/partitions.py; docs/postgresql.md): retention "
        "drops whole partitions; a change applies to the partitions created after it; SQLite has no partitions",
    )
    partitions_ahead_days: int = setting(
        "database.partitions_ahead_days",
        parse_int(1, 366),
        7,
        "days ahead of today for which PostgreSQL partitions are kept created (at start and by the scheduler's "
        "retention job); a record past them lands in the default partition and moves out when its own is created",
    )
