"""The acceptance split (monitor/drift/explain.py): exactness, what it names, A/A, interval coverage by
simulation with known truth, thin and bad inputs; and on a real store, the drift run and its alert."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from monitor.alerts.evaluate import evaluate_alerts
from monitor.alerts.models import AlertRow
from monitor.drift import explain_read
from monitor.drift.explain import NOT_SPLIT, Explanation, Stratum, explain, sentence
from monitor.drift.queries import latest_run, pin_baseline
from monitor.drift.run import explain_drift, run_drift
from monitor.drift.sampling import sample_requests
from tests.alerting import make_settings
from tests.drift.conftest import store
from tests.drift.records import window_stream

# Cell -> (requests in the reference window, in the current one, acceptance rate).
Design = Mapping[str, tuple[int, int, float]]


def draw(rng: np.random.Generator, window: int, cell: str, n: int, rate: float, spread: float = 4.0) -> Stratum:
    """``n`` requests drafting 8-40 tokens each; each request's own rate is Beta around ``rate``, so that
    requests vary far more than tokens (``spread`` small: strong clustering)."""
    drafted = rng.integers(8, 41, n).astype(float)
    own = rng.beta(rate * spread, (1 - rate) * spread, n)
    return Stratum(window, cell, drafted, rng.binomial(drafted.astype(int), own).astype(float))


def simulate(rng: np.random.Generator, design: Design, current: Mapping[str, float] | None = None) -> list[Stratum]:
    strata = []
    for cell, (n_ref, n_cur, rate) in design.items():
        strata.append(draw(rng, 0, cell, n_ref, rate))
        strata.append(draw(rng, 1, cell, n_cur, (current or {}).get(cell, rate)))
    return strata


def truth(design: Design, current: Mapping[str, float] | None = None) -> dict[tuple[str, str | None], float]:
    """The parts of the process itself: drafted per request has the same mean in every cell, so the
    weights are the request shares and the rates the Beta means."""
    cells = list(design)
    w = np.array([[design[c][k] for c in cells] for k in (0, 1)], dtype=float)
    w /= w.sum(axis=1, keepdims=True)
    r = np.array([[design[c][2] for c in cells], [(current or {}).get(c, design[c][2]) for c in cells]])
    big = (w * r).sum(axis=1)
    mix = float(((r.mean(axis=0) - big.mean()) * (w[1] - w[0])).sum())
    parts: dict[tuple[str, str | None], float] = {("mix", None): mix}
    for i, c in enumerate(cells):
        parts[("within", c)] = float(w[:, i].mean() * (r[1, i] - r[0, i]))
    return parts


def named(e: Explanation) -> set[tuple[str, str | None]]:
    return {(p.cause, p.workload) for p in e.parts if p.named}


def split(strata: list[Stratum], seed: int = 0, n_boot: int = 400) -> Explanation:
    return explain(strata, min_requests=30, n_boot=n_boot, seed=seed, fdr_level=0.01)


def test_parts_add_up_to_the_change_exactly() -> None:
    rng = np.random.default_rng(7)
    design = {"chat": (800, 1500, 0.45), "code": (900, 400, 0.72), "sum": (300, 350, 0.6), "rare": (20, 5, 0.3)}
    e = split(simulate(rng, design, {"code": 0.6}))
    assert e.change is not None and e.rate_ref is not None and e.rate_cur is not None
    assert e.change == pytest.approx(e.rate_cur - e.rate_ref, abs=1e-15)
    # "rare" is thin and alone: it cannot be merged with anything, so it is the unexplained rest.
    assert [(p.cause, p.workload) for p in e.parts] == [
        ("mix", None), ("within", "chat"), ("within", "code"), ("within", "sum"), ("unexplained", None)
    ]  # fmt: skip
    assert abs(sum(p.value for p in e.parts) - e.change) < 1e-12
    # The rest is the thin cell's own term, relative to the mean rate: Δ(W_rare · (R_rare − R̄)).
    strata = simulate(np.random.default_rng(7), design, {"code": 0.6})
    drafted = [sum(s.drafted.sum() for s in strata if s.window == k) for k in (0, 1)]
    rare = [next(s for s in strata if s.window == k and s.cell == "rare") for k in (0, 1)]
    mean = (e.rate_ref + e.rate_cur) / 2
    own = [rare[k].drafted.sum() / drafted[k] * (rare[k].accepted.sum() / rare[k].drafted.sum() - mean) for k in (0, 1)]
    assert e.parts[-1].value == pytest.approx(own[1] - own[0], abs=1e-12)
    # Without a thin cell there is no rest: mix and within alone add up to the change.
    full = split(simulate(np.random.default_rng(7), {k: v for k, v in design.items() if k != "rare"}, {"code": 0.6}))
    assert [p.cause for p in full.parts] == ["mix", "within", "within", "within"]
    assert abs(sum(p.value for p in full.parts) - (full.change or math.nan)) < 1e-12
    # The pooled rate is what the rollups say: sum accepted / sum drafted, not a mean of per-request rates.
    ref = [s for s in simulate(np.random.default_rng(7), design, {"code": 0.6}) if s.window == 0]
    assert e.rate_ref == pytest.approx(sum(s.accepted.sum() for s in ref) / sum(s.drafted.sum() for s in ref))


def test_symmetric_and_centred() -> None:
    """Swapping the windows negates every part (the symmetric form), and a shift towards the workload
    that accepts least reads negative (the centred mix term)."""
    rng = np.random.default_rng(11)
    strata = simulate(rng, {"chat": (600, 1400, 0.4), "code": (1400, 600, 0.75), "sum": (500, 500, 0.6)})
    forward = split(strata)
    backward = split([Stratum(1 - s.window, s.cell, s.drafted, s.accepted) for s in strata])
    for f, b in zip(forward.parts, backward.parts, strict=True):
        assert (f.cause, f.workload) == (b.cause, b.workload) and f.value == pytest.approx(-b.value, abs=1e-12)
    mix = forward.parts[0]
    assert mix.cause == "mix" and mix.value < -0.05 and mix.named
    # "sum" kept its share of drafts: an uncentred term (r̄_c Δw_c) would still give it half the mix.
    assert mix.detail["workload"] in ("chat", "code") and mix.detail["shares"]["sum"][0] == pytest.approx(
        mix.detail["shares"]["sum"][1], abs=0.02
    )


def test_pure_mix_shift_names_mix_only() -> None:
    rng = np.random.default_rng(1)
    e = split(simulate(rng, {"chat": (1200, 2800, 0.4), "code": (2800, 1200, 0.7)}))
    assert named(e) == {("mix", None)}
    said = sentence(e)
    assert said.startswith("Acceptance fell 0.") and "from the mix moving to chat (30 % -> 70 % of drafts)" in said
    assert "within" not in said


def test_pure_within_drop_names_that_workload_only() -> None:
    rng = np.random.default_rng(2)
    design = {"chat": (2000, 2000, 0.45), "code": (2000, 2000, 0.7), "sum": (2000, 2000, 0.6)}
    e = split(simulate(rng, design, {"code": 0.55}))
    assert named(e) == {("within", "code")}
    code = next(p for p in e.parts if p.workload == "code")
    assert code.low is not None and code.high is not None and code.low < -0.05 < code.high < 0  # truth: 1/3 · -0.15
    assert "within code (0.70 -> 0.55)" in sentence(e)


def test_aa_names_nothing() -> None:
    """200 seeded A/A runs (the same process in both windows, three workloads): the share that names
    any part is the false-naming rate. Measured over 400 such runs: 1.0 % with BH at the drift run's
    level (0.01), 5.5 % at 0.05; the bound leaves room for seeds, not for a split that names noise."""
    design = {"chat": (300, 300, 0.45), "code": (300, 300, 0.7), "sum": (200, 200, 0.6)}
    runs = [split(simulate(np.random.default_rng(1000 + i), design), seed=i, n_boot=200) for i in range(200)]
    false = sum(bool(named(e)) for e in runs)
    assert false <= 5, f"{false} of 200 A/A runs named a part"
    # Without the floor and BH, the intervals alone exclude zero in about 5 % of parts: the test can see that.
    raw = sum(p.low is not None and p.high is not None and (p.low > 0 or p.high < 0) for e in runs for p in e.parts)
    assert raw >= 10


def test_intervals_cover_the_truth() -> None:
    """Coverage by simulation, known truth, strongly clustered requests: each 95 % interval holds the
    process's true part in >= 90 % of 200 seeded trials (measured: 93.5-97 % per part). A token-level
    interval would not: with Beta(4) request rates it is about half as wide."""
    # "sum" is resampled request by request, the others from the normal limit (EXACT_UP_TO).
    design = {"chat": (400, 700, 0.45), "code": (500, 300, 0.72), "sum": (200, 200, 0.6)}
    current = {"code": 0.62}
    true = truth(design, current)
    hits = {key: 0 for key in true}
    trials = 200
    for i in range(trials):
        e = split(simulate(np.random.default_rng(5000 + i), design, current), seed=i, n_boot=300)
        for p in e.parts:
            assert p.low is not None and p.high is not None
            hits[(p.cause, p.workload)] += p.low <= true[(p.cause, p.workload)] <= p.high
    coverage = {key: n / trials for key, n in hits.items()}
    assert min(coverage.values()) >= 0.90, coverage


def test_sampled_strata_scale_to_their_population() -> None:
    """A stratum read as a sample of n of its N requests (the drift run's hash sample) with the exact
    totals: the estimate is the population's, the interval the population's (√(n/N) of the sample's),
    and it still covers the truth."""
    design = {"chat": (8_000, 12_000, 0.45), "code": (8_000, 4_000, 0.72)}
    current = {"code": 0.7}
    true = truth(design, current)
    hits, trials, widths = 0, 100, []
    for i in range(trials):
        rng = np.random.default_rng(9000 + i)
        strata = []
        for s in simulate(rng, design, current):
            pick = rng.choice(len(s.drafted), 800, replace=False)
            totals = (float(s.accepted.sum()), float(s.drafted.sum()))
            strata.append(Stratum(s.window, s.cell, s.drafted[pick], s.accepted[pick], len(s.drafted), totals))
        e = split(strata, seed=i, n_boot=300)
        code = next(p for p in e.parts if p.workload == "code")
        assert code.low is not None and code.high is not None
        hits += code.low <= true[("within", "code")] <= code.high
        widths.append(code.high - code.low)
        if i == 0:
            whole = split(simulate(np.random.default_rng(9000), design, current))
            assert e.change == pytest.approx(whole.change, abs=1e-12)
            unscaled = split([Stratum(s.window, s.cell, s.drafted, s.accepted) for s in strata], seed=i, n_boot=300)
            unscaled_code = next(p for p in unscaled.parts if p.workload == "code")
            assert unscaled_code.high is not None and unscaled_code.low is not None
            assert (code.high - code.low) < 0.6 * (unscaled_code.high - unscaled_code.low)
    assert hits / trials >= 0.90


def test_thin_workloads_are_merged_into_other() -> None:
    rng = np.random.default_rng(4)
    design = {"chat": (1000, 1000, 0.45), "code": (1000, 1000, 0.7), "a": (20, 25, 0.3), "b": (15, 20, 0.3)}
    e = split(simulate(rng, design))
    other = [p for p in e.parts if p.cause == "within" and p.workload is None]
    assert len(other) == 1 and other[0].detail["merged"] and other[0].detail["requests_ref"] == 35
    assert not any(p.cause == "unexplained" for p in e.parts)
    assert abs(sum(p.value for p in e.parts) - (e.change or math.nan)) < 1e-12


@pytest.mark.parametrize(
    ("strata", "reason"),
    [
        ([], "no drafts in the reference window"),
        ([Stratum(0, "chat", np.full(50, 10.0), np.full(50, 5.0))], "no drafts in the current window"),
        (
            [Stratum(0, "chat", np.full(50, 10.0), np.full(50, 5.0)), Stratum(1, "chat", np.zeros(50), np.zeros(50))],
            "no drafts in the current window",
        ),
        (
            [Stratum(k, c, np.full(9, 10.0), np.full(9, 5.0)) for k in (0, 1) for c in ("chat", "code")],
            "every workload has fewer than 30 requests in a window",
        ),
    ],
)  # fmt: skip
def test_nothing_to_split_says_so(strata: list[Stratum], reason: str) -> None:
    e = split(strata)
    assert [p.cause for p in e.parts] == ["unexplained"] and not e.parts[0].named
    assert e.parts[0].detail["reason"] == f"{NOT_SPLIT}: {reason}"
    assert reason in sentence(e)
    shape = e.to_json()
    assert shape["low"] is None and shape["high"] is None and shape["parts"][0]["low"] is None


def test_one_workload_is_its_within_part_alone() -> None:
    """No mix between one workload: its within part is the whole change, named when it is clear of noise."""
    rng = np.random.default_rng(12)
    e = split(simulate(rng, {"chat": (400, 400, 0.6)}, {"chat": 0.45}))
    assert [(p.cause, p.workload, p.named) for p in e.parts] == [("within", "chat", True)]
    assert e.change is not None and e.parts[0].value == pytest.approx(e.change, abs=1e-12)
    assert sentence(e).startswith(f"Acceptance fell {abs(e.change):.2f}") and "within chat (0." in sentence(e)


def test_bad_figures_are_dropped_not_split() -> None:
    """NaN, negative and impossible per-request figures and impossible totals never reach the split."""
    rng = np.random.default_rng(6)
    strata = simulate(rng, {"chat": (500, 500, 0.45), "code": (500, 500, 0.7)}, {"code": 0.5})
    clean = split(strata)
    dirty = []
    for s in strata:
        junk_d = np.array([np.nan, 10.0, -4.0, 5.0, np.inf])
        junk_a = np.array([3.0, np.nan, 1.0, 9.0, 1.0])  # 9 accepted of 5 drafted: not a request
        dirty.append(
            Stratum(s.window, s.cell, np.concatenate([s.drafted, junk_d]), np.concatenate([s.accepted, junk_a]))
        )
    assert split(dirty).to_json() == clean.to_json()
    # Totals that cannot be a stratum's sums (NaN, more accepted than drafted): the sample stands for the stratum.
    broken = [Stratum(s.window, s.cell, s.drafted, s.accepted, 10**6, (math.nan, 1.0)) for s in strata]
    assert split(broken).to_json() == clean.to_json()


def test_same_data_same_intervals() -> None:
    strata = simulate(np.random.default_rng(8), {"chat": (300, 500, 0.45), "code": (300, 200, 0.7)})
    assert split(strata, seed=3).to_json() == split(list(reversed(strata)), seed=3).to_json()
    assert split(strata, seed=3).parts[1].low != split(strata, seed=4).parts[1].low


# On a real store: the drift run splits over its default windows, the acceptance alert says it.

T0 = datetime(2026, 3, 1, tzinfo=UTC)
CUR = T0 + timedelta(hours=24)
NOW = T0 + timedelta(hours=25)


def populate(engine: Engine, current: Mapping[str, float], counts: Mapping[str, int] | None = None) -> None:
    records = []
    for workload, alpha in {"code": 0.8, "chat": 0.5, "sum": 0.65}.items():
        records += window_stream(T0, CUR, 300, workload=workload, alpha=alpha, answer_tokens=100)
        n = (counts or {}).get(workload, 300)
        rate = current.get(workload, alpha)
        records += window_stream(CUR, NOW, n, workload=workload, alpha=rate, seed=1, answer_tokens=100)
    store(engine, records)


def test_drift_run_explains_and_the_alert_says_it(engine: Engine, tmp_path: Path) -> None:
    populate(engine, {"code": 0.6})
    settings = make_settings(tmp_path, engine.url.render_as_string(hide_password=False))
    run = run_drift(engine, settings.drift, NOW, current=timedelta(hours=1), reference=timedelta(hours=24))
    e = run.explanation
    assert e is not None and named(e) == {("unexplained", "code")}
    assert run.to_json()["acceptance_split"]["parts"][2]["workload"] == "code"
    # The command's read over the same windows gives the same split (it reads its own samples).
    windows, again = explain_drift(engine, settings.drift, NOW, current=timedelta(hours=1))
    assert (windows.cur_start, windows.ref_start) == (CUR, T0) and again.to_json() == e.to_json()
    evaluate_alerts(engine, settings.alert_config, run.results, now=NOW)
    with engine.connect() as conn:
        rows = conn.execute(select(AlertRow.labels, AlertRow.annotations).where(AlertRow.rule == "acceptance_drop"))
        descriptions = [(labels["workload"], annotations["description"]) for labels, annotations in rows]
    assert descriptions and {workload for workload, _ in descriptions} == {"code"}
    for _, description in descriptions:
        assert (
            description.startswith("Acceptance fell 0.")
            and "within code (0." in description
            and "mix" not in description
        )
    assert any("acceptance: drift, effect" in description for _, description in descriptions)


def test_drift_run_names_a_mix_shift(engine: Engine) -> None:
    populate(engine, {}, {"chat": 900, "code": 100})
    run = run_drift(engine, None, NOW, current=timedelta(hours=1), reference=timedelta(hours=24))
    assert run.explanation is not None and named(run.explanation) == {("mix", None)}
    # Code, the workload that accepts most, lost most of its share: the largest term of the mix.
    assert "from the mix moving away from code (25 % -> 5 % of drafts)" in sentence(run.explanation)


def test_a_pinned_workload_is_split_over_its_own_windows(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Code falls from 0.8 to 0.6 six hours in; its baseline is pinned to those six hours. The rolling
    # reference (the whole day) is mostly after the fall: split over it, code would have barely moved.
    fall = T0 + timedelta(hours=6)
    records = window_stream(T0, fall, 300, workload="code", alpha=0.8, answer_tokens=100)
    records += window_stream(fall, NOW, 1500, workload="code", alpha=0.6, seed=1, answer_tokens=100)
    records += window_stream(T0, NOW, 1500, workload="chat", alpha=0.5, seed=2, answer_tokens=100)
    store(engine, records)
    pin_baseline(engine, "code", at=fall, length=timedelta(hours=6))
    settings = make_settings(tmp_path, engine.url.render_as_string(hide_password=False))
    # The run-wide splits (acceptance and decode speed) read code's samples over the run's windows, which its
    # own tests did not: once for both, one per window.
    read: list[tuple[str | None, datetime]] = []

    def counted(conn: Any, workload: str | None, pair: Any, start: datetime, *args: Any, **kwargs: Any) -> Any:
        read.append((workload, start))
        return sample_requests(conn, workload, pair, start, *args, **kwargs)

    monkeypatch.setattr(explain_read, "sample_requests", counted)
    run = run_drift(engine, settings.drift, NOW, current=timedelta(hours=1), reference=timedelta(hours=24))
    assert sorted(read) == [("code", T0), ("code", CUR)]

    def rate(start: datetime, end: datetime) -> float:
        kept = [r for r in records if r.workload == "code" and start <= r.ts_start < end]
        return sum(r.num_accepted_tokens for r in kept) / sum(r.num_draft_tokens for r in kept)

    windows, own = run.own_splits["code"]
    assert (windows.ref_start, windows.ref_end, windows.cur_start) == (T0, fall, CUR)
    assert own.rate_ref is not None and abs(own.rate_ref - rate(T0, fall)) < 1e-9
    assert own.change is not None and own.change < -0.15 and named(own) == {("unexplained", "code")}
    # The run's own split over the rolling windows stays what it was: chat is not split over code's windows.
    assert run.explanation is not None and run.explanation.rate_ref is not None
    assert abs(own.rate_ref - run.explanation.rate_ref) > 0.1
    stored = latest_run(engine)
    assert stored is not None and stored.acceptance_split is not None
    code = stored.acceptance_split["workloads"]["code"]
    assert code["windows"]["reference"] == [T0.isoformat(), fall.isoformat()] and code["note"].startswith("pinned")
    assert code["change"] == pytest.approx(own.change)
    # The command, asked about code, compares what its drift test compares.
    again_windows, again = explain_drift(engine, settings.drift, NOW, current=timedelta(hours=1), workload="code")
    assert again_windows == windows and again.to_json() == own.to_json()
    _, chat = explain_drift(engine, settings.drift, NOW, current=timedelta(hours=1), workload="chat")
    assert {p.workload for p in chat.parts} <= {None, "chat"} and chat.rate_ref == run.explanation.rate_ref
    evaluate_alerts(engine, settings.alert_config, run.results, now=NOW)
    with engine.connect() as conn:
        rows = conn.execute(select(AlertRow.labels, AlertRow.annotations).where(AlertRow.rule == "acceptance_drop"))
        descriptions = [annotations["description"] for labels, annotations in rows if labels["workload"] == "code"]
    assert descriptions
    for description in descriptions:
        assert f"({own.rate_ref:.2f} -> {own.rate_cur:.2f})" in description
        assert "Over code's own windows: pinned baseline" in description
