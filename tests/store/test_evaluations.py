"""Stored evaluations (monitor/store/evaluations.py) on a SQLite file and on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from monitor.store.evaluations import latest_evaluations, save_evaluation
from tests.store.schema import assert_migrated_as_declared

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def candidate(measured: float) -> dict[str, Any]:
    return {"drafter": "ngram", "predicted_speedup": 1.2, "gamma": 3, "measured_speedup": measured,
            "acceptance": 0.6, "acceptance_interval": [0.5, 0.7], "drafted": 100, "accepted": 60}  # fmt: skip


def report(workload: str, recommendation: str, measured: float) -> dict[str, Any]:
    """A workload report as `draftwatch evaluate --json` prints it (decoder/evaluation.py's to_dict)."""
    return {
        "workload": workload,
        "learn_prompts": 3,
        "held_out_prompts": 2,
        "plain_ms_per_token": 30.0,
        "candidates": [candidate(measured)],
        "recommendation": recommendation,
        "recommended_gamma": 3 if recommendation != "plain" else None,
        "measured_best": recommendation,
        "recommendation_matches": True,
    }


def test_the_migration_creates_the_table_the_model_declares(engine: Engine) -> None:
    assert_migrated_as_declared(engine, {"evaluations"})


def test_the_newest_run_per_target_and_workload_is_what_the_pairs_page_reads(engine: Engine) -> None:
    both = [report("code", "plain", 0.9), report("prose", "plain", 0.8)]
    old = save_evaluation(engine, both, target_model="qwen-coder-1.5b", target_version="v1", sample="old.jsonl",
                          ran_at=T0)  # fmt: skip
    new = save_evaluation(engine, [report("code", "ngram", 1.4)], target_model="qwen-coder-1.5b",
                          target_version="v1", sample="capture", ran_at=T0 + timedelta(hours=1))  # fmt: skip
    other = save_evaluation(engine, [report("code", "ngram", 1.1)], target_model="smollm2-135m",
                            target_version=None, sample="builtin", ran_at=T0 + timedelta(hours=2))  # fmt: skip
    assert len({old, new, other}) == 3
    found = {(e.target_model, e.workload): e for e in latest_evaluations(engine)}
    assert set(found) == {("qwen-coder-1.5b", "code"), ("qwen-coder-1.5b", "prose"), ("smollm2-135m", "code")}
    code = found[("qwen-coder-1.5b", "code")]
    assert (code.run_id, code.recommendation, code.sample, code.ran_at) == (
        new,
        "ngram",
        "capture",
        T0 + timedelta(hours=1),
    )
    assert code.candidates[0]["measured_speedup"] == pytest.approx(1.4)
    assert found[("qwen-coder-1.5b", "prose")].run_id == old  # a workload the newer run left out keeps its verdict
    only = latest_evaluations(engine, target_model="smollm2-135m")
    assert [(e.run_id, e.target_version) for e in only] == [(other, None)]


def test_a_report_without_its_workload_is_refused_and_nothing_is_stored(engine: Engine) -> None:
    with pytest.raises(ValueError, match="workload's name"):
        save_evaluation(engine, [report("code", "plain", 1.0), {"recommendation": "plain"}],
                        target_model="t", target_version=None, sample="s")  # fmt: skip
    with pytest.raises(ValueError, match="nothing to store"):
        save_evaluation(engine, [], target_model="t", target_version=None, sample="s")
    assert latest_evaluations(engine) == []
