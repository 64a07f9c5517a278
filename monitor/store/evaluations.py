"""Stored evaluations (``draftwatch evaluate --store``, migration 0009) and the read of the latest ones.

An evaluation validates candidate drafters on a prompt sample before they serve; storing it puts
its verdict beside the live figures of the dashboard's Pairs page. One row per workload of a run:
the run's id and time, the target, what the sample was, the recommendation, and the workload's
whole report as evaluate's ``--json`` prints it (``decoder.evaluation.WorkloadReport.to_dict``),
so that the report can grow fields without a migration. Prompts are never part of it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Index, String, func, insert, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Mapped, mapped_column

from monitor.store.models import Base, BigId


class EvaluationRow(Base):
    __tablename__ = "evaluations"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(64))
    ran_at: Mapped[datetime]
    target_model: Mapped[str] = mapped_column(String(512))
    target_version: Mapped[str | None] = mapped_column(String(512))
    sample: Mapped[str] = mapped_column(String(300))
    workload: Mapped[str] = mapped_column(String(64))
    recommendation: Mapped[str | None] = mapped_column(String(256))  # None: no embedded candidate to recommend
    recommendation_matches: Mapped[bool] = mapped_column(Boolean)
    report: Mapped[dict[str, Any]] = mapped_column(JSON)

    __table_args__ = (Index("ix_evaluations_target_model_workload_ran_at", "target_model", "workload", "ran_at"),)


@dataclass(frozen=True, slots=True)
class StoredEvaluation:
    """One workload's verdict of one evaluation run."""

    run_id: str
    ran_at: datetime
    target_model: str
    target_version: str | None
    sample: str
    workload: str
    recommendation: str | None  # a drafter's label or "plain"; None when only servers were measured
    recommendation_matches: bool
    report: dict[str, Any]

    @property
    def candidates(self) -> list[dict[str, Any]]:
        """The report's candidates, each as evaluate's JSON gives it (drafter, speedups, gamma, acceptance...)."""
        found = self.report.get("candidates")
        return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []


def save_evaluation(
    engine: Engine,
    reports: Sequence[Mapping[str, Any]],
    *,
    target_model: str,
    target_version: str | None,
    sample: str,
    ran_at: datetime | None = None,
) -> str:
    """Store one run's workload reports (evaluate's JSON form) in one transaction; return the run's id."""
    if not reports:
        raise ValueError("an evaluation without workload reports has nothing to store")
    run_id, when = uuid.uuid4().hex, ran_at or datetime.now(UTC)
    rows = []
    for report in reports:
        workload = report.get("workload")
        if not isinstance(workload, str) or not workload:
            raise ValueError(f"a workload report needs its workload's name, got {workload!r}")
        rows.append(
            {
                "run_id": run_id,
                "ran_at": when,
                "target_model": target_model,
                "target_version": target_version,
                "sample": sample[:300],
                "workload": workload,
                "recommendation": _recommendation(report),
                "recommendation_matches": bool(report.get("recommendation_matches", False)),
                "report": dict(report),
            }
        )
    with engine.begin() as conn:
        conn.execute(insert(EvaluationRow), rows)
    return run_id


def _recommendation(report: Mapping[str, Any]) -> str | None:
    found = report.get("recommendation")
    return str(found)[:256] if found is not None else None


def latest_evaluations(engine: Engine, target_model: str | None = None) -> list[StoredEvaluation]:
    """The newest stored verdict per target and workload (of ``target_model`` only, when given)."""
    newest = select(
        EvaluationRow.target_model, EvaluationRow.workload, func.max(EvaluationRow.ran_at).label("ran_at")
    ).group_by(EvaluationRow.target_model, EvaluationRow.workload)
    if target_model is not None:
        newest = newest.where(EvaluationRow.target_model == target_model)
    latest = newest.subquery()
    query = (
        select(EvaluationRow)
        .join(
            latest,
            (EvaluationRow.target_model == latest.c.target_model)
            & (EvaluationRow.workload == latest.c.workload)
            & (EvaluationRow.ran_at == latest.c.ran_at),
        )
        .order_by(EvaluationRow.workload, EvaluationRow.target_model)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        StoredEvaluation(
            run_id=row.run_id,
            ran_at=row.ran_at,
            target_model=row.target_model,
            target_version=row.target_version,
            sample=row.sample,
            workload=row.workload,
            recommendation=row.recommendation,
            recommendation_matches=row.recommendation_matches,
            report=row.report if isinstance(row.report, dict) else {},
        )
        for row in rows
    ]
