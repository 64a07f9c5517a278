"""Stored evaluations: one row per workload of a `draftwatch evaluate --store` run.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out, not imported from the models: a migration is a frozen snapshot.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "evaluations",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("ran_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("target_model", sa.String(length=512), nullable=False),
        sa.Column("target_version", sa.String(length=512), nullable=True),
        sa.Column("sample", sa.String(length=300), nullable=False),
        sa.Column("workload", sa.String(length=64), nullable=False),
        sa.Column("recommendation", sa.String(length=256), nullable=True),
        sa.Column("recommendation_matches", sa.Boolean(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evaluations")),
    )
    op.create_index(
        "ix_evaluations_target_model_workload_ran_at", "evaluations", ["target_model", "workload", "ran_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_evaluations_target_model_workload_ran_at", table_name="evaluations")
    op.drop_table("evaluations")
