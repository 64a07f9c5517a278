"""The tables a migration creates compared with those the models declare (monitor/store/models.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine


def assert_migrated_as_declared(engine: Engine, tables: set[str]) -> None:
    """``tables``, their columns' types and their indexes on ``engine`` (migrated to the head) are the models'."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from monitor.store.models import Base

    def ours(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
        return table in tables

    assert tables <= set(Base.metadata.tables), sorted(tables - set(Base.metadata.tables))
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": ours})
        assert compare_metadata(context, Base.metadata) == []
