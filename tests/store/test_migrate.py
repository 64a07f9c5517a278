"""Migrations on both dialects: up, down, matching the models, concurrent upgrades, the CLI."""

from __future__ import annotations

import argparse
import json
import threading
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from monitor.commands.db import register
from monitor.store import migrate
from monitor.store.engine import create_engine
from monitor.store.models import Base, declared_for

TABLES = {"requests", "model_versions", "deployment_events", "rollup_minute", "rollup_bins", "recorder_batches"}


def _ours(dialect_name: str) -> Any:
    """Compare only this revision's tables (later revisions, other issues, own theirs), and of the model only
    what it declares on this dialect (requests' unique key differs: monitor/store/models.py)."""

    def include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
        return table in TABLES and (reflected or declared_for(obj, dialect_name))

    return include


def test_upgrade_downgrade_and_models_match(db_url: str) -> None:
    engine = create_engine(db_url)
    assert migrate.current_revision(engine) is None
    assert migrate.upgrade(engine) == migrate.head_revision()
    assert set(inspect(engine).get_table_names()) >= TABLES
    with engine.connect() as conn:
        opts = {"compare_type": True, "include_object": _ours(engine.dialect.name)}
        diff = compare_metadata(MigrationContext.configure(conn, opts=opts), Base.metadata)
    assert diff == []
    assert migrate.upgrade(engine) == migrate.head_revision()  # idempotent
    assert migrate.downgrade(engine, "base") is None
    assert not TABLES & set(inspect(engine).get_table_names())
    migrate.upgrade(engine)
    assert migrate.is_current(engine)
    engine.dispose()


def test_concurrent_upgrades_are_safe(db_url: str) -> None:
    errors: list[BaseException] = []

    def replica() -> None:
        engine = create_engine(db_url)
        try:
            migrate.upgrade(engine)
        except BaseException as error:  # collected for the assertion below
            errors.append(error)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=replica) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    engine = create_engine(db_url)
    assert migrate.is_current(engine)
    engine.dispose()


def test_cli(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())

    def run(*argv: str) -> int:
        args = parser.parse_args(["db", "--database-url", db_url, *argv])
        return int(args.handler(args))

    assert run("current") == 0
    assert "base (empty)" in capsys.readouterr().out
    assert run("upgrade") == 0
    assert run("current") == 0
    assert "(up to date)" in capsys.readouterr().out
    assert run("current", "--json") == 0
    head = migrate.head_revision()
    assert json.loads(capsys.readouterr().out) == {"current": head, "head": head, "up_to_date": True}
    assert run("downgrade", "base") == 0
    assert run("downgrade", "nonsense") == 1
    assert "nonsense" in capsys.readouterr().err


def _speed_rollups(engine: Any) -> tuple[dict[tuple[str, str], tuple[int, float]], dict[tuple[str, int], int]]:
    from sqlalchemy import select

    from monitor.store.models import RollupBinRow, RollupMinuteRow

    m, b = RollupMinuteRow, RollupBinRow
    with engine.connect() as conn:
        timed = conn.execute(select(m.workload, m.mode, m.n_timed, m.sum_ms_per_token))
        minutes = {(w, mode): (n, s) for w, mode, n, s in timed}
        counts = conn.execute(select(b.workload, b.bin, b.count).where(b.metric == "ms_per_token"))
        bins = {(w, i): c for w, i, c in counts}
    return minutes, bins


def test_decode_speed_revision_recomputes_stored_rollups(db_url: str) -> None:
    from monitor.store.writes.writer import write_batch
    from tests.records import api_record

    engine = create_engine(db_url)
    migrate.upgrade(engine)
    # 12 tokens in 500 ms, 40 of them before the first token: decode 460/11, whole request 500/12.
    records = [api_record("a"), api_record("b", workload="code", ttft_ms=None), api_record("c", output_tokens=1)]
    with engine.begin() as conn:
        write_batch(conn, records, "batch-1", "test")
    written = _speed_rollups(engine)
    assert written[0][("chat", "speculative")] == (1, pytest.approx(460 / 11))
    assert written[0][("code", "speculative")] == (0, 0.0)  # no TTFT: no decode phase to time

    migrate.downgrade(engine, "0003")
    old = _speed_rollups(engine)[0]
    assert old[("chat", "speculative")][0] == 2  # 'a' and 'c' (one token) had a whole-request figure
    assert old[("chat", "speculative")][1] == pytest.approx(500 / 12 + 500 / 1)
    assert old[("code", "speculative")] == (1, pytest.approx(500 / 12))

    migrate.upgrade(engine)
    assert _speed_rollups(engine) == written
    engine.dispose()
