"""Database faults the tests force: a rule the application cannot know about, so a write fails for real."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Engine


def refuse_value(engine: Engine, table: str, column: str, value: str) -> None:
    """Make the database refuse any row of ``table`` whose ``column`` is ``value`` (insert or update).

    PostgreSQL gets a CHECK constraint, whose error quotes the whole failing row in its DETAIL; SQLite
    a trigger. Either way the error reaches the code as the driver raised it.
    """
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text(f"ALTER TABLE {table} ADD CONSTRAINT refuse_{column} CHECK ({column} <> '{value}')"))
            return
        for event in ("INSERT", "UPDATE"):
            conn.execute(
                text(
                    f"CREATE TRIGGER refuse_{column}_{event.lower()} BEFORE {event} ON {table} "
                    f"WHEN NEW.{column} = '{value}' BEGIN SELECT RAISE(ABORT, 'refused by a test rule'); END"
                )
            )
