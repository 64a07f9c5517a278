"""Level 2 of the acceptance split (monitor/drift/explain_factors.py): each staged cause named alone, A/A,
interval coverage against the known truth, causality said only where the data shows it, thin and bad
input; and on a real store, a new system prompt named in the drift run's sentence."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy.engine import Engine

from monitor.drift.explain import Explanation, Part, sentence
from monitor.drift.explain_factors import RequestFactors, Requests, label_requests, split_within
from monitor.drift.run import run_drift
from tests.drift.conftest import store
from tests.drift.records import window_stream
from tests.drift.test_explain import CUR, NOW, T0

BASE = RequestFactors(200, 100, 0.0, 1.0, 4, "aaaa", 0.05, "model", "m", "d1", "t1", "r1", None)
# A cell: (requests, acceptance rate, the factors where it differs from BASE).
Cell = tuple[int, float, Mapping[str, Any]]
COPYING, NOT_COPYING = {"copy_share": 0.8}, {"copy_share": 0.05}


def window(rng: np.random.Generator, cells: Sequence[Cell], spread: float = 4.0) -> Requests:
    """Requests drafting 8-40 tokens, each with its own Beta rate around its cell's; prompt lengths vary at
    random in every cell (50-400 tokens: three length buckets), a factor that must take no part."""
    drafted, accepted, rows = [], [], []
    for n, rate, fields in cells:
        d = rng.integers(8, 41, n)
        drafted.append(d)
        accepted.append(rng.binomial(d, rng.beta(rate * spread, (1 - rate) * spread, n)))
        rows += [BASE._replace(prompt_tokens=int(p), **fields) for p in rng.integers(50, 400, n)]
    return label_requests(np.concatenate(drafted).astype(float), np.concatenate(accepted).astype(float), rows)


def split(ref: Requests, cur: Requests, seed: int = 0, n_boot: int = 300, total: float | None = None) -> list[Part]:
    return split_within((ref, cur), "code", 0.5, min_requests=30, n_boot=n_boot, seed=seed, fdr_level=0.01, total=total)


def named(parts: list[Part]) -> set[str]:
    return {p.cause for p in parts if p.named}


def copy_shift(rng: np.random.Generator, before: float, after: float, n: int = 800) -> tuple[Requests, Requests]:
    """Answers that copy their prompt accept 0.75, the others 0.15; only the chance that one copies moves
    (each request copies or not at random, as real traffic's composition varies between windows)."""
    copying = rng.binomial(n, [before, after])
    ref, cur = (window(rng, [(int(c), 0.75, COPYING), (n - int(c), 0.15, NOT_COPYING)]) for c in copying)
    return ref, cur


def test_parts_add_up_to_the_within_part_exactly() -> None:
    ref, cur = copy_shift(np.random.default_rng(1), 0.7, 0.3)
    parts = split(ref, cur, total=-0.123)
    assert [p.cause for p in parts] == ["length", "content", "unexplained"]  # the groups that vary, then the rest
    assert abs(sum(p.value for p in parts) + 0.123) < 1e-12
    # Without a Level 1 figure, they add up to the sample's own change, scaled by the workload's weight.
    own = split(ref, cur)
    rate = [w.accepted.sum() / w.drafted.sum() for w in (ref, cur)]
    assert sum(p.value for p in own) == pytest.approx(0.5 * (rate[1] - rate[0]), abs=1e-12)
    assert own[-1].detail["constant"] == ["sampling", "style", "version", "health"]


def test_a_fall_in_copying_is_named_content_alone() -> None:
    ref, cur = copy_shift(np.random.default_rng(2), 0.7, 0.3)
    parts = split(ref, cur)
    assert named(parts) == {"content"}
    content = parts[1]
    assert content.value == pytest.approx(0.5 * (0.15 - 0.75) * 0.4, abs=0.03)
    assert content.detail["cells"]["copy share >= 60 %"]["share_ref"] == pytest.approx(0.7, abs=0.05)


def test_a_rate_drop_inside_every_cell_is_unexplained_not_a_factor() -> None:
    rng = np.random.default_rng(3)
    ref = window(rng, [(800, 0.7, {})])
    cur = window(rng, [(800, 0.5, {})])
    assert named(split(ref, cur)) == {"unexplained"}


def test_a_drafter_version_side_by_side_is_an_effect() -> None:
    rng = np.random.default_rng(4)
    ref = window(rng, [(800, 0.66, {})])
    cur = window(rng, [(400, 0.66, {}), (400, 0.45, {"draft_version": "d2"})])
    parts = split(ref, cur)
    version = next(p for p in parts if p.cause == "version")
    assert named(parts) == {"version"}
    assert version.detail["lead"] == "model m, drafter d2, target t1"
    assert version.detail["same_window"] and version.detail["versus"] == "model m, drafter d1, target t1"


def test_a_full_switch_of_version_only_coincides() -> None:
    rng = np.random.default_rng(5)
    ref = window(rng, [(800, 0.66, {})])
    cur = window(rng, [(800, 0.45, {"draft_version": "d2"})])
    parts = split(ref, cur)
    version = next(p for p in parts if p.cause == "version")
    # Every request of each window has one version: the whole drop sits in the version's cells.
    assert named(parts) == {"version"} and not version.detail["same_window"]
    within = Part("within", "code", version.value, None, None, True, 0.0, {"rate_ref": 0.66, "rate_cur": 0.45})
    e = Explanation(version.value, None, None, 0.66, 0.45, (within,)).with_split(within, parts)
    said = sentence(e)
    assert "coinciding with a change of version (model m, drafter d" in said and "same window" not in said


def test_aa_names_nothing() -> None:
    """No group named in 200 A/A runs (each at FDR 0.01 over its parts, with a 0.01 floor: expected < 1 %)."""
    rng = np.random.default_rng(6)
    cells: list[Cell] = [(300, 0.75, COPYING), (300, 0.15, NOT_COPYING), (200, 0.5, {"draft_version": "d2"})]
    false = sum(bool(named(split(window(rng, cells), window(rng, cells), seed=i, n_boot=200))) for i in range(200))
    assert false <= 2


def test_intervals_cover_the_truth() -> None:
    """The content part's 95 % interval holds the true (0.15 - 0.75) x 0.3 x 0.5 in at least 90 % of 150 trials."""
    rng = np.random.default_rng(7)
    truth = (0.15 - 0.75) * 0.3 * 0.5
    hits = 0
    for i in range(150):
        content = split(*copy_shift(rng, 0.6, 0.3, n=600), seed=i, n_boot=200)[1]
        hits += content.low <= truth <= content.high  # type: ignore[operator]
    assert hits >= 135


def test_thin_cells_are_merged_and_nothing_to_split_is_empty() -> None:
    rng = np.random.default_rng(8)
    # Ten system prompts of 8 requests each: every one is thin, so they are one merged cell.
    ref = window(rng, [(800, 0.6, {})])
    cur = window(rng, [(8, 0.6, {"style_hash": f"s{i}"}) for i in range(10)] + [(720, 0.6, {})])
    style = next(p for p in split(ref, cur) if p.cause == "style")
    assert "other (thin cells)" in style.detail["cells"] and len(style.detail["cells"]) == 2
    assert split(ref, window(rng, [(0, 0.6, {})])) == []


def test_bad_figures_are_left_out() -> None:
    rows = [BASE] * 4
    kept = label_requests(np.array([10.0, np.nan, 0.0, 5.0]), np.array([5.0, 1.0, 0.0, 6.0]), rows)
    assert list(kept.drafted) == [10.0] and kept.labels["content"] == ["copy share <10 %"]
    unknown = label_requests(np.array([10.0]), np.array([5.0]), [BASE._replace(copy_share=None, temperature=None)])
    assert unknown.labels["content"] == ["copy share unknown"] and unknown.labels["sampling"] == ["T ?, k 4"]


def test_a_replica_that_decays_with_uptime_is_named_health() -> None:
    """The engine watch's figures label health: a replica up for hours accepting less than when fresh."""
    rng = np.random.default_rng(10)
    fresh = {"replica": "r1", "replica_uptime_s": 600.0, "kv_cache_use": 0.3}
    aged = {"replica": "r1", "replica_uptime_s": 8 * 3600.0, "kv_cache_use": 0.3}
    parts = split(window(rng, [(800, 0.7, fresh)]), window(rng, [(800, 0.45, aged)]))
    health = next(p for p in parts if p.cause == "health")
    assert named(parts) == {"health"} and health.detail["lead"] == "replica r1, up 6-24 h, KV cache under 0.6"
    # One replica, aged from one window to the next: not identified, so said as uptime and KV use together.
    within = Part("within", "code", health.value, None, None, True, 0.0, {"rate_ref": 0.7, "rate_cur": 0.45})
    said = sentence(Explanation(health.value, None, None, 0.7, 0.45, (within,)).with_split(within, parts))
    assert "coinciding with uptime and KV use together (replica r1, up 6-24 h, KV cache under 0.6 0 % -> 100 %" in said
    # The same replica restarted beside its aged self in the current window: identified, said as an effect.
    cur = window(rng, [(500, 0.45, aged), (500, 0.7, fresh)])
    parts = split(window(rng, [(800, 0.7, fresh)]), cur)
    health = next(p for p in parts if p.cause == "health")
    said = sentence(Explanation(health.value, None, None, 0.7, 0.6, (within,)).with_split(within, parts))
    assert health.detail["same_window"] and "from health: replica r1, up 6-24 h, KV cache under 0.6 at 0.4" in said
    full = label_requests(np.array([10.0]), np.array([5.0]), [BASE._replace(
        engine_version="b11434", replica_uptime_s=90_000.0, kv_cache_use=0.9, cached_prompt_tokens=150)])  # fmt: skip
    assert full.labels["health"] == ["replica r1, up a day or more, KV cache 0.8 or more, prefix cache half or more"]
    assert full.labels["version"] == ["model m, drafter d1, target t1, engine b11434"]


def test_same_data_same_split() -> None:
    ref, cur = copy_shift(np.random.default_rng(9), 0.7, 0.4)
    assert split(ref, cur, seed=3) == split(ref, cur, seed=3)
    assert split(ref, cur, seed=3)[1].low != split(ref, cur, seed=4)[1].low


def test_drift_run_names_a_new_system_prompt(engine: Engine) -> None:
    """On a real store: code's current window serves 70 % of its requests with a new system prompt that
    accepts less; the drift run's split names style within code, and its sentence says which."""
    records = []
    for workload, alpha in {"code": 0.8, "chat": 0.5}.items():
        records += window_stream(T0, CUR, 400, workload=workload, alpha=alpha, answer_tokens=100)
        records += window_stream(CUR, NOW, 400, workload=workload, alpha=alpha, seed=1, answer_tokens=100)
    styled = []
    for r in records:
        new = r.workload == "code" and r.ts_start >= CUR and int(r.request_id.split("-")[2]) % 10 < 7
        style = "bbbbbbbbbbbb" if new else "aaaaaaaaaaaa"
        styled.append(dataclasses.replace(r, style_hash=style))
    low = window_stream(CUR, NOW, 400, workload="code", alpha=0.45, seed=2, answer_tokens=100)
    new_style = {r.request_id for r in styled if r.style_hash == "bbbbbbbbbbbb"}
    # The new prompt's requests accept 0.45: their counts come from a stream drawn at that rate.
    lowered = {r.ts_start: r for r in low}
    styled = [
        dataclasses.replace(lowered[r.ts_start], request_id=r.request_id, style_hash=r.style_hash)
        if r.request_id in new_style
        else r
        for r in styled
    ]
    store(engine, styled)
    run = run_drift(engine, None, NOW, current=timedelta(hours=1), reference=timedelta(hours=24))
    e = run.explanation
    assert e is not None
    code = {p.cause: p for p in e.parts if p.workload == "code"}
    assert code["style"].named and not code["length"].named
    assert code["style"].detail["lead"] == "system prompt bbbbbbbbbbbb"
    assert "within code (0." in sentence(e) and "from style (system prompt bbbbbbbbbbbb 0 % -> " in sentence(e)
