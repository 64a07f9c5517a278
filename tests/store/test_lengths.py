"""Acceptance by prompt length and by output position, on both dialects: stored, rolled up, read,
and filled for stored history by migration 0007."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from decoder.record import RequestRecord
from monitor.store import lengths, migrate
from monitor.store.reads import queries
from monitor.store.writes.rows import from_row
from monitor.store.writes.writer import REQUESTS, write_batch
from tests.records import T0, api_record

END = T0 + timedelta(hours=1)
PROMPTS = (10, 255, 256, 1023, 1024, 5000)


def records() -> list[RequestRecord]:
    """Records over every prompt bucket; the embedded-like ones carry spans, the stack-like ones none."""
    rng = random.Random(7)
    out = []
    for i in range(60):
        drafted = [rng.randint(0, 12) for _ in range(3)]
        accepted = [rng.randint(0, d) for d in drafted]
        spans = {"drafted_by_span": drafted, "accepted_by_span": accepted} if i % 3 else {}
        out.append(
            api_record(
                f"r-{i}",
                ts_start=T0 + timedelta(seconds=30 * i),
                ts_end=T0 + timedelta(seconds=30 * i + 1),
                workload=("chat", "code")[i % 2],
                prompt_tokens=PROMPTS[i % len(PROMPTS)],
                num_draft_tokens=sum(drafted),
                num_accepted_tokens=sum(accepted),
                accepted_per_position=[],
                acceptance_histogram=[],
                num_spec_steps=0,
                **spans,
            )
        )
    return [r.check() for r in out]


def store(engine: Engine, recs: list[RequestRecord], batch: str = "b-1") -> None:
    with engine.begin() as conn:
        assert write_batch(conn, recs, batch, "live").stored == len(recs)


def expected(recs: list[RequestRecord], workload: str) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    mine = [r for r in recs if r.workload == workload]
    prompt = [(0, 0, 0)] * len(lengths.PROMPT_LABELS)
    for r in mine:
        if r.num_draft_tokens:
            i = lengths.prompt_bucket(r.prompt_tokens)
            n, d, a = prompt[i]
            prompt[i] = (n + 1, d + r.num_draft_tokens, a + r.num_accepted_tokens)
    spans = []
    for s in range(len(lengths.SPAN_LABELS)):
        known = [r for r in mine if r.drafted_by_span is not None and r.accepted_by_span is not None]
        spans.append(
            (
                sum(1 for r in known if r.drafted_by_span[s]),  # type: ignore[index]
                sum(r.drafted_by_span[s] for r in known),  # type: ignore[index]
                sum(r.accepted_by_span[s] for r in known),  # type: ignore[index]
            )
        )
    return prompt, spans


def counts(buckets: list[queries.LengthAcceptance]) -> list[tuple[int, int, int]]:
    return [(b.drafting_requests, b.drafted, b.accepted) for b in buckets]


def test_breakdowns_match_the_records(engine: Engine) -> None:
    recs = records()
    store(engine, recs)
    summaries = {s.workload: s for s in queries.workload_summaries(engine, T0, END)}
    for workload, summary in summaries.items():
        prompt, spans = expected(recs, workload)
        assert [b.bucket for b in summary.by_prompt_length] == list(lengths.PROMPT_LABELS)
        assert [b.bucket for b in summary.by_output_position] == ["0-32", "32-128", "128+"]
        assert counts(summary.by_prompt_length) == prompt
        assert counts(summary.by_output_position) == spans
        for b in summary.by_prompt_length + summary.by_output_position:
            assert b.acceptance_rate == (b.accepted / b.drafted if b.drafted else None)
    # Token-weighted over the buckets is the workload's own acceptance.
    chat = summaries["chat"]
    assert sum(b.accepted for b in chat.by_prompt_length) / sum(b.drafted for b in chat.by_prompt_length) == (
        chat.acceptance_rate_tokens
    )
    assert (chat.by_prompt_length[0].low, chat.by_prompt_length[0].high) == (0, 256)
    assert (chat.by_prompt_length[-1].low, chat.by_prompt_length[-1].high) == (4096, None)


def test_a_reader_of_every_workload_can_leave_the_breakdowns_unread(engine: Engine) -> None:
    store(engine, records())
    full = queries.workload_summaries(engine, T0, END)
    light = queries.workload_summaries(engine, T0, END, lengths_too=False)
    assert all(s.by_prompt_length == s.by_output_position == [] for s in light)
    assert [replace(s, by_prompt_length=[], by_output_position=[]) for s in full] == light


def test_unknown_spans_are_null_not_zeros(engine: Engine) -> None:
    recs = records()
    store(engine, recs)
    with engine.connect() as conn:
        nulls = conn.execute(text("SELECT COUNT(*) FROM requests WHERE drafted_by_span IS NULL")).scalar_one()
        row = conn.execute(select(REQUESTS).where(REQUESTS.c.request_id == "r-1")).one()
        bare = conn.execute(select(REQUESTS).where(REQUESTS.c.request_id == "r-0")).one()
    assert nulls == sum(1 for r in recs if r.drafted_by_span is None) == 20
    assert from_row(row) == recs[1]
    assert from_row(bare).drafted_by_span is None and from_row(bare).accepted_by_span is None


def test_migration_0007_fills_the_prompt_buckets_of_stored_history(engine: Engine) -> None:
    recs = records()
    store(engine, recs)
    before = queries.workload_summaries(engine, T0, END)
    # Back to 0006: the columns and every by-length bin go; the requests stay.
    assert migrate.downgrade(engine, "0006") == "0006"
    with engine.connect() as conn:
        left = conn.execute(text("SELECT COUNT(*) FROM rollup_bins WHERE metric LIKE 'prompt_%'")).scalar_one()
    assert left == 0
    assert migrate.upgrade(engine) == migrate.head_revision()
    after = queries.workload_summaries(engine, T0, END)
    for old, new in zip(before, after, strict=True):
        assert counts(new.by_prompt_length) == counts(old.by_prompt_length)
        # Spans are not in old rows: nothing to recover, and nothing invented.
        assert counts(new.by_output_position) == [(0, 0, 0)] * 3
    # A record written after the backfill lands in the same rollup rows (same bucket form).
    first = next(r for r in recs if r.workload == "chat" and r.num_draft_tokens)
    late = replace(first, request_id="late", drafted_by_span=None, accepted_by_span=None)
    store(engine, [late], "b-2")
    with engine.connect() as conn:
        duplicates = conn.execute(
            text(
                "SELECT COUNT(*) FROM (SELECT bucket, workload, metric, bin, COUNT(*) AS n FROM rollup_bins "
                "GROUP BY bucket, workload, target_model, drafter, draft_model, mode, metric, bin) AS g WHERE n > 1"
            )
        ).scalar_one()
    assert duplicates == 0
    chat = {s.workload: s for s in queries.workload_summaries(engine, T0, END)}["chat"]
    bucket = lengths.prompt_bucket(late.prompt_tokens)
    old = {s.workload: s for s in after}["chat"].by_prompt_length[bucket]
    assert chat.by_prompt_length[bucket].drafting_requests == old.drafting_requests + 1


def test_migration_0007_resumes_a_fill_that_was_cut_short(engine: Engine) -> None:
    """An upgrade stopped after the columns (or some days of history) were committed runs again to the same end.

    On PostgreSQL the migration commits its columns before it fills history a day at a time, so that
    ingest is not locked out for the fill; a run cut short leaves them in place, unstamped.
    """
    from alembic import command

    if engine.dialect.name != "postgresql":
        pytest.skip("on SQLite the upgrade is one transaction: a run cut short leaves nothing behind")
    store(engine, records())
    before = queries.workload_summaries(engine, T0, END)
    with engine.connect() as conn:
        command.stamp(migrate.alembic_config(conn), "0006")  # as if the run had stopped inside 0007
        conn.commit()
    assert migrate.upgrade(engine, "0007") == "0007"
    after = queries.workload_summaries(engine, T0, END)
    assert [counts(s.by_prompt_length) for s in after] == [counts(s.by_prompt_length) for s in before]
