"""Alembic environment for draftwatch; driven from monitor.store.migrate, which passes the connection.

Run through ``draftwatch db upgrade`` (or :func:`monitor.store.migrate.upgrade`), never bare ``alembic``:
the caller opens the connection (holding the PostgreSQL advisory lock) and hands it over in
``config.attributes["connection"]``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from monitor.store.engine import create_engine
from monitor.store.models import Base, declared_for

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place: batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        # Of the models, compare only what they declare on this dialect (requests' unique key differs).
        include_object=lambda obj, _name, _type, reflected, _other: (
            reflected or declared_for(obj, connection.dialect.name)
        ),
    )


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no connection or sqlalchemy.url given; use `draftwatch db upgrade`")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
