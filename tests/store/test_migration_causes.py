"""Migration 0017: the record's cause fields on a populated requests table, partitioned on PostgreSQL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import inspect, text

from monitor.store import migrate
from monitor.store.engine import create_engine
from monitor.store.writes.rows import from_row
from monitor.store.writes.writer import write_batch
from tests.records import api_record

CAUSES = ("replica", "cached_prompt_tokens", "style_hash", "prompt_copy_share")
GIVEN: dict[str, Any] = {
    "replica": "10.0.0.7:8000",
    "cached_prompt_tokens": 16,
    "style_hash": "0123456789ab",
    "prompt_copy_share": 0.75,
}


def _stored(engine: Any) -> dict[str, dict[str, Any]]:
    with engine.connect() as conn:
        return {r.request_id: dict(r._mapping) for r in conn.execute(text("SELECT * FROM requests"))}


def test_upgrade_and_downgrade_keep_the_rows_and_store_the_fields_or_null(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        migrate.upgrade(engine, "0016")
        with engine.begin() as conn:  # rows written before the columns existed
            conn.execute(
                text(
                    "INSERT INTO requests (request_id, ts_start, ts_end, workload, target_model, drafter, mode,"
                    " num_speculative_tokens, prompt_tokens, output_tokens, num_spec_steps, num_draft_tokens,"
                    " num_accepted_tokens, accepted_per_position, acceptance_histogram, temperature, top_p,"
                    " finish_reason, source, stopped_mid_step, mode_inferred, ingested_at) VALUES (:id,"
                    " :t, :t, 'chat', 'm', 'none', 'plain', 0, 5, 5, 0, 0, 0, '[]', '[]', 0, 1, 'stop', 'api',"
                    " false, false, :t)"
                ),
                [{"id": f"old-{i}", "t": f"2026-12-0{i + 1} 00:00:00"} for i in range(3)],
            )
        if engine.dialect.name == "postgresql":
            with engine.connect() as conn:
                assert conn.execute(text("SELECT relkind FROM pg_class WHERE relname = 'requests'")).scalar() == "p"

        assert migrate.upgrade(engine) == migrate.head_revision()
        with engine.begin() as conn:
            write_batch(conn, [api_record("new", **GIVEN), api_record("bare")], "batch-1", "test")
        stored = _stored(engine)
        assert len(stored) == 5
        for name in ("old-0", "old-1", "old-2", "bare"):
            assert {k: stored[name][k] for k in CAUSES} == dict.fromkeys(CAUSES)  # NULL, never 0
        assert {k: stored["new"][k] for k in CAUSES} == GIVEN
        with engine.connect() as conn:
            row = conn.execute(text("SELECT * FROM requests WHERE request_id = 'new'")).one()
        assert {k: getattr(from_row(row), k) for k in CAUSES} == GIVEN
        if engine.dialect.name == "postgresql":  # the parent's columns reached its partitions
            partition_columns = {c["name"] for c in inspect(engine).get_columns("requests_default")}
            assert set(CAUSES) <= partition_columns

        migrate.downgrade(engine, "0016")
        after = _stored(engine)
        assert sorted(after) == sorted(stored)
        assert not set(CAUSES) & set(after["new"])

        migrate.upgrade(engine)
        assert {k: _stored(engine)["new"][k] for k in CAUSES} == dict.fromkeys(CAUSES)
    finally:
        engine.dispose()
