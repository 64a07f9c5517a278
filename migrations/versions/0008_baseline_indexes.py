"""Partial indexes on the baseline traffic (holdout and plain requests), which every speed comparison reads.

The dashboard's cost ratios read the newest plain and holdout requests of a workload, and the drift
run's net-loss fallback reads the holdout and plain requests of a target across workloads. Both are
a few per cent of ``requests``, so with only the (workload, ts_start) and pair indexes PostgreSQL
walked every speculative request in between or scanned the table: on 10M requests 0.11 s per
workload on the overview page (5.7 s for 50 workloads) and 0.3-0.9 s per drift test (13 s of a
14 s run). Partial indexes hold only those rows, so ingest pays for them on a few per cent of its
inserts.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BASELINE = "mode <> 'speculative'"


def upgrade() -> None:
    where = sa.text(BASELINE)
    op.create_index(
        "ix_requests_baseline_workload_ts",
        "requests",
        ["workload", "ts_start"],
        postgresql_where=where,
        sqlite_where=where,
    )
    op.create_index(
        "ix_requests_baseline_target_ts",
        "requests",
        ["target_model", "ts_start"],
        postgresql_include=["id", "mode"],
        postgresql_where=where,
        sqlite_where=where,
    )


def downgrade() -> None:
    op.drop_index("ix_requests_baseline_target_ts", table_name="requests")
    op.drop_index("ix_requests_baseline_workload_ts", table_name="requests")
