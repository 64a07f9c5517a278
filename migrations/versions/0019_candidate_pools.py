"""candidate_pools: the candidates each sidecar serves a rollout with, per deployment, as it last announced them.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06

``draftwatch rollout start`` reads them where its own settings name no candidate pool (issue 52:
the pool is the sidecars' flag, not the command's). A new table: a change of the catalogue only.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "candidate_pools",
        sa.Column("instance", sa.String(length=255), nullable=False),
        sa.Column("deployment", sa.String(length=512), nullable=False),
        sa.Column("candidates", sa.JSON(), nullable=False),
        sa.Column("setting", sa.String(length=128), nullable=False),
        sa.Column("current_drafters", sa.JSON(), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("instance", "deployment", name=op.f("pk_candidate_pools")),
    )


def downgrade() -> None:
    op.drop_table("candidate_pools")
