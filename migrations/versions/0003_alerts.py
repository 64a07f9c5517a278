"""Alerting and scheduling tables: alerts, silences, notifications (outbox), scheduler lease, job runs.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out, not imported from the models: a migration is a frozen snapshot.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def _id() -> sa.Column[int]:
    return sa.Column("id", BIG_ID, autoincrement=True, nullable=False)


def upgrade() -> None:
    op.create_table(
        "alerts",
        _id(),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("rule", sa.String(length=64), nullable=False),
        sa.Column("severity", sa.String(length=16), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("annotations", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("episode", sa.Integer(), nullable=False),
        sa.Column("active_runs", sa.Integer(), nullable=False),
        sa.Column("clear_runs", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("pending_since", _ts(), nullable=True),
        sa.Column("fired_at", _ts(), nullable=True),
        sa.Column("resolved_at", _ts(), nullable=True),
        sa.Column("last_eval_at", _ts(), nullable=False),
        sa.Column("notified", sa.Boolean(), nullable=False),
        sa.Column("last_notified_at", _ts(), nullable=True),
        sa.Column("acked_at", _ts(), nullable=True),
        sa.Column("acked_by", sa.Text(), nullable=True),
        sa.Column("ack_comment", sa.Text(), nullable=True),
        sa.Column("fire_times", sa.JSON(), nullable=False),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("updated_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
        sa.UniqueConstraint("fingerprint", name=op.f("uq_alerts_fingerprint")),
    )
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.create_index("ix_alerts_state", ["state"], unique=False)
    op.create_table(
        "silences",
        _id(),
        sa.Column("matchers", sa.JSON(), nullable=False),
        sa.Column("starts_at", _ts(), nullable=False),
        sa.Column("ends_at", _ts(), nullable=False),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("expired_at", _ts(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_silences")),
    )
    op.create_table(
        "notifications",
        _id(),
        sa.Column("notification_id", sa.String(length=64), nullable=False),
        sa.Column("receiver", sa.String(length=128), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("group_key", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("alerts", sa.JSON(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("next_attempt_at", _ts(), nullable=False),
        sa.Column("claimed_until", _ts(), nullable=True),
        sa.Column("claimed_by", sa.Text(), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", _ts(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notifications")),
        sa.UniqueConstraint("notification_id", name=op.f("uq_notifications_notification_id")),
    )
    with op.batch_alter_table("notifications", schema=None) as batch_op:
        batch_op.create_index("ix_notifications_status_next", ["status", "next_attempt_at"], unique=False)
        batch_op.create_index("ix_notifications_receiver_group", ["receiver", "group_key", "id"], unique=False)
    op.create_table(
        "scheduler_lease",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", _ts(), nullable=False),
        sa.Column("renewed_at", _ts(), nullable=False),
        sa.Column("expires_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_scheduler_lease")),
    )
    op.create_table(
        "job_runs",
        _id(),
        sa.Column("job", sa.String(length=32), nullable=False),
        sa.Column("tick", _ts(), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", _ts(), nullable=False),
        sa.Column("finished_at", _ts(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_runs")),
        sa.UniqueConstraint("job", "tick", name="uq_job_runs_job_tick"),
    )
    with op.batch_alter_table("job_runs", schema=None) as batch_op:
        batch_op.create_index("ix_job_runs_started", ["started_at"], unique=False)


def downgrade() -> None:
    for table in ("job_runs", "scheduler_lease", "notifications", "silences", "alerts"):
        op.drop_table(table)
