"""rollouts and rollout_events: a candidate drafter staged on live traffic, step by step, and what the judge decided.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out, not imported from the models: a migration is a frozen snapshot.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("deployment", sa.String(length=512), nullable=False),
        sa.Column("drafter", sa.String(length=256), nullable=False),
        sa.Column("steps", sa.JSON(), nullable=False),
        sa.Column("interval_s", sa.Float(), nullable=False),
        sa.Column("per_workload", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("holds", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("step_started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.String(length=1024), nullable=False),
        sa.Column("workloads", sa.JSON(), nullable=False),
        sa.Column("judgement", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollouts")),
    )
    op.create_index("ix_rollouts_status", "rollouts", ["status"])
    active = sa.text("status IN ('running', 'promoted')")
    op.create_index("uq_rollouts_active_deployment", "rollouts", ["deployment"], unique=True,
                    postgresql_where=active, sqlite_where=active)  # fmt: skip
    op.create_table(
        "rollout_events",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("rollout_id", BIG_ID, nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("share", sa.Float(), nullable=False),
        sa.Column("workload", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.String(length=1024), nullable=False),
        sa.Column("judgement", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["rollout_id"], ["rollouts.id"], name=op.f("fk_rollout_events_rollout_id_rollouts"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rollout_events")),
    )
    op.create_index("ix_rollout_events_rollout_id_ts", "rollout_events", ["rollout_id", "ts"])
    op.create_index("ix_rollout_events_ts", "rollout_events", ["ts"])


def downgrade() -> None:
    op.drop_index("ix_rollout_events_ts", table_name="rollout_events")
    op.drop_index("ix_rollout_events_rollout_id_ts", table_name="rollout_events")
    op.drop_table("rollout_events")
    op.drop_index("uq_rollouts_active_deployment", table_name="rollouts")
    op.drop_index("ix_rollouts_status", table_name="rollouts")
    op.drop_table("rollouts")
