"""Scrape mode: scrape_intervals (the engines' counters per target, series and interval) and scrape_targets.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out, not imported from the models: a migration is a frozen snapshot.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _ts(name: str, nullable: bool = False) -> sa.Column[sa.DateTime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "scrape_intervals",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("target", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("workload", sa.String(length=64), nullable=False),
        sa.Column("target_model", sa.String(length=512), nullable=False),
        sa.Column("drafter", sa.String(length=128), nullable=False),
        _ts("started_at"),
        _ts("ended_at"),
        sa.Column("drafts", sa.BigInteger(), nullable=True),
        sa.Column("draft_tokens", sa.BigInteger(), nullable=True),
        sa.Column("accepted_tokens", sa.BigInteger(), nullable=True),
        sa.Column("accepted_per_position", sa.JSON(), nullable=True),
        sa.Column("accept_rate", sa.Float(), nullable=True),
        sa.Column("accept_length", sa.Float(), nullable=True),
        sa.Column("reset", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_scrape_intervals")),
    )
    op.create_index("ix_scrape_intervals_workload_ended_at", "scrape_intervals", ["workload", "ended_at"])
    op.create_index("ix_scrape_intervals_target_ended_at", "scrape_intervals", ["target", "ended_at"])
    op.create_table(
        "scrape_targets",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.String(length=300), nullable=True),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("resets", sa.Integer(), nullable=False),
        _ts("reset_at", nullable=True),
        _ts("scraped_at"),
        _ts("up_at", nullable=True),
        sa.Column("counters", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_scrape_targets")),
    )


def downgrade() -> None:
    op.drop_table("scrape_targets")
    op.drop_index("ix_scrape_intervals_target_ended_at", table_name="scrape_intervals")
    op.drop_index("ix_scrape_intervals_workload_ended_at", table_name="scrape_intervals")
    op.drop_table("scrape_intervals")
