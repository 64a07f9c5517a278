"""Initial schema: requests, model versions and deployment events, per-minute rollups, recorder batches.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out here instead of imported from monitor.db.models: a migration is a frozen snapshot,
# and must keep working after the models move on.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON_LIST = sa.JSON()


def _ts() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def _id() -> sa.Column[int]:
    return sa.Column("id", BIG_ID, autoincrement=True, nullable=False)


def _rollup_key() -> list[sa.Column[object]]:
    return [
        sa.Column("bucket", _ts(), nullable=False),
        sa.Column("workload", sa.String(length=64), nullable=False),
        sa.Column("target_model", sa.Text(), nullable=False),
        sa.Column("drafter", sa.Text(), nullable=False),
        sa.Column("draft_model", sa.Text(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
    ]


ROLLUP_KEY = ["bucket", "workload", "target_model", "drafter", "draft_model", "mode"]


def upgrade() -> None:
    op.create_table(
        "model_versions",
        _id(),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("first_seen", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
        sa.UniqueConstraint("role", "model", "version", name=op.f("uq_model_versions_role_model_version")),
    )
    op.create_table(
        "recorder_batches",
        _id(),
        sa.Column("batch_id", sa.String(length=64), nullable=False),
        sa.Column("origin", sa.String(length=16), nullable=False),
        sa.Column("n_records", sa.Integer(), nullable=False),
        sa.Column("committed_at", _ts(), nullable=False),
        sa.Column("host", sa.Text(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_recorder_batches")),
        sa.UniqueConstraint("batch_id", name=op.f("uq_recorder_batches_batch_id")),
    )
    op.create_table(
        "requests",
        _id(),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("ts_start", _ts(), nullable=False),
        sa.Column("ts_end", _ts(), nullable=False),
        sa.Column("workload", sa.String(length=64), nullable=False),
        sa.Column("target_model", sa.Text(), nullable=False),
        sa.Column("drafter", sa.Text(), nullable=False),
        sa.Column("draft_model", sa.Text(), nullable=True),
        sa.Column("target_version", sa.Text(), nullable=True),
        sa.Column("draft_version", sa.Text(), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("num_speculative_tokens", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("num_spec_steps", sa.BigInteger(), nullable=False),
        sa.Column("num_draft_tokens", sa.BigInteger(), nullable=False),
        sa.Column("num_accepted_tokens", sa.BigInteger(), nullable=False),
        sa.Column("accepted_per_position", JSON_LIST, nullable=False),
        sa.Column("acceptance_histogram", JSON_LIST, nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("draft_ms", sa.Float(), nullable=True),
        sa.Column("verify_ms", sa.Float(), nullable=True),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("top_p", sa.Float(), nullable=False),
        sa.Column("finish_reason", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("prompt_hash", sa.Text(), nullable=True),
        sa.Column("stopped_mid_step", sa.Boolean(), nullable=False),
        sa.Column("ingested_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_requests")),
        sa.UniqueConstraint("request_id", name=op.f("uq_requests_request_id")),
    )
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.create_index("ix_requests_workload_ts", ["workload", "ts_start"], unique=False)
        batch_op.create_index(
            "ix_requests_pair_ts", ["target_model", "drafter", "draft_model", "ts_start"], unique=False
        )
        batch_op.create_index("ix_requests_ts", ["ts_start"], unique=False, postgresql_using="brin")

    op.create_table(
        "rollup_minute",
        _id(),
        *_rollup_key(),
        *[
            sa.Column(name, sa.BigInteger(), nullable=False)
            for name in (
                "n_requests",
                "n_errors",
                "sum_prompt_tokens",
                "sum_output_tokens",
                "sum_spec_steps",
                "sum_draft_tokens",
                "sum_accepted_tokens",
                "n_drafting",
            )
        ],
        sa.Column("sum_acceptance_rate", sa.Float(), nullable=False),
        sa.Column("n_timed", sa.BigInteger(), nullable=False),
        sa.Column("sum_ms_per_token", sa.Float(), nullable=False),
        sa.Column("sum_timed_latency_ms", sa.Float(), nullable=False),
        sa.Column("sum_timed_output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("n_ttft", sa.BigInteger(), nullable=False),
        sa.Column("sum_ttft_ms", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollup_minute")),
        sa.UniqueConstraint(*ROLLUP_KEY, name="uq_rollup_minute_key"),
    )
    with op.batch_alter_table("rollup_minute", schema=None) as batch_op:
        batch_op.create_index("ix_rollup_minute_workload_bucket", ["workload", "bucket"], unique=False)

    op.create_table(
        "rollup_bins",
        _id(),
        *_rollup_key(),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("bin", sa.Integer(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollup_bins")),
        sa.UniqueConstraint(*ROLLUP_KEY, "metric", "bin", name="uq_rollup_bins_key"),
    )
    with op.batch_alter_table("rollup_bins", schema=None) as batch_op:
        batch_op.create_index("ix_rollup_bins_workload_metric_bucket", ["workload", "metric", "bucket"], unique=False)

    op.create_table(
        "deployment_events",
        _id(),
        sa.Column("ts", _ts(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("model_version_id", BIG_ID, nullable=False),
        sa.Column("workload", sa.String(length=64), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["model_version_id"],
            ["model_versions.id"],
            name=op.f("fk_deployment_events_model_version_id_model_versions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment_events")),
    )
    with op.batch_alter_table("deployment_events", schema=None) as batch_op:
        batch_op.create_index("ix_deployment_events_ts", ["ts"], unique=False)


def downgrade() -> None:
    # Dropping a table drops its indexes on both dialects.
    for table in (
        "deployment_events",
        "rollup_bins",
        "rollup_minute",
        "requests",
        "recorder_batches",
        "model_versions",
    ):
        op.drop_table(table)
