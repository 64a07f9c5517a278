"""The rollout judge's error rates, on SIMULATED traffic through the real code path (issue 39).

    python -m benchmarks.rollout [--quick] [--no-write] [--jobs 2] [--seed 2026]
                                 [--tolerance 0.05] [--min-requests 30] [--ci 0.98] [--only NAME ...]

A simulation, not production data, but every decision is the product's: each simulated rollout
has a SQLite file of its own (a copy of a migrated empty one), is started with
``monitor.proxy.rollout.start_rollout``, gets its requests through the store's writer
(``monitor.store.writes.writer.write_batch``, as the recorder writes them, when each request ends)
and is judged by ``advance_rollouts`` at every simulated minute, as the scheduler's rollout job
(``scheduler.rollout_interval``, 1 min) runs it: the judge looks at the step's cumulative requests
again and again, so the repeated looks are in every figure.

Traffic, one workload, both pools speculative (the candidate's requests under its drafter name, the
current pool's under ``upstream``, as the proxy stores them):

* a fixed number of requests a side in each ``rollout.interval`` (30 min), their start times uniform
  within it (a Poisson count would add holds for too few requests, a matter of volume, not of the
  judge); the candidate's share of the deployment's requests is the step's;
* decode ms per output token lognormal, log sd 0.25 (and rows at 0.15 and 0.35), the candidate's median
  the current drafter's divided by its relative speed (0.80: "20 % slower", 1.25x the ms per token,
  as the judge's docstring counts it). Why 0.25: the project's own model of per-request acceptance
  (``benchmarks/drift_quality.py``: Beta, concentration 12, gamma 4, 1 + Poisson(19) steps) gives
  per-request ms per token a log sd of 0.21 at mean acceptance 0.55 (0.13 at 0.80, 0.26 at 0.25)
  from acceptance alone; the time of a step itself varies too, by 0.03-0.11 (log sd) between
  requests of one llama.cpp server and workload (the 95 % intervals of the engine verdicts in
  benchmarks/RESULTS.md, 30 requests a side). 0.25 is their sum in quadrature, rounded up; the
  rows at 0.15 (the rollout tests' figure) and 0.35 (drift_quality's) show how much hangs on it;
* output tokens lognormal around 200 (log sd 0.6), prompts around 400 (0.8), TTFT linear in the
  prompt with log sd 0.2 of jitter (the same on both sides: the candidate changes decoding only),
  requests in flight at the replica 1 + Poisson(0.5) on both sides, independent of speed.

Each "step" row runs the first step of ``rollout.steps = (share, 1.0)`` until the rollout job
advances it (``advanced``), rolls it back on a failing critical metric (``failed``) or gives up
after ``rollout.max_holds`` (3) more intervals without a decision (``gave up``). Reported: the
share of each outcome; for A/A (candidate equal to the current drafter) the false rollbacks per
interval of judging (the steps' minutes ÷ 30, exact Poisson 95 % interval) and per step
(Clopper-Pearson), and what held the steps; for a slower candidate the share rolled back at the
first judgement, by the end of the first and of the second interval, the candidate's requests
started before the rollback against ``rollout.min_requests`` (the least the judge can decide on;
the sidecars' ``proxy.route_refresh_s``, 10 s, adds a few more), and the minutes to each
decision. The "whole rollout" row runs the default steps 5/25/50/100 % end to end.

Targets (issue 39): under no change at most 1 % of intervals fail; a candidate 20 % slower caught
(rolled back) within two intervals in at least 95 % of rollouts at 30 requests a side; a losing
candidate's requests before its rollback at most twice the judge's minimum.

``--tolerance``, ``--min-requests`` and ``--ci`` (``rollout.ci_level``) change the judge's settings
for every row. ``--quick`` runs a few seeds per row, to check
that it works; figures go into RESULTS.md unless ``--no-write`` or ``--quick``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from scipy import stats
from sqlalchemy.engine import Engine

from benchmarks.results import write_section
from decoder.record import RequestRecord
from monitor.proxy.rollout import advance_rollouts, start_rollout
from monitor.proxy.settings import ProxySettings, RolloutSettings
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.rollouts import CURRENT_DRAFTER, get_rollout
from monitor.store.writes.writer import write_batch

TITLE = "Rollout judge error rates (benchmarks/rollout.py, simulation)"
CANDIDATE = "candidate-drafter"
WORKLOAD = "chat"
TARGET = "target-model"
PROXY = ProxySettings(upstream=("http://spec:8080",), candidate_upstream=("http://cand:8080",))
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LOOK = timedelta(minutes=1)  # scheduler.rollout_interval: the rollout job runs every minute
INTERVAL = timedelta(minutes=30)  # rollout.interval's default
MAX_HOLDS = 3  # rollout.max_holds' default
DEFAULT_STEPS = (0.05, 0.25, 0.5, 1.0)  # rollout.steps' default
MS_PER_TOKEN = 20.0  # the current drafter's median decode ms per output token (the scale does not matter)
FloatArray = np.ndarray[Any, np.dtype[np.float64]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]


class Columns(NamedTuple):
    """One side's requests, a value per request: what a record's timings and counts are made of."""

    per_token: FloatArray  # decode ms per output token
    output: IntArray
    prompt: IntArray
    ttft: FloatArray
    drafted: IntArray
    accepted: IntArray
    inflight: IntArray


@dataclass(frozen=True, slots=True)
class Modelled:
    """Requests of the model in the module docstring, decode ms per token lognormal around ``ms``."""

    ms: float
    sd: float
    ttft_spread: bool = True  # TTFT linear in the prompt (log sd about 0.8); False: 50 ms, log sd 0.05

    def draw(self, rng: np.random.Generator, n: int) -> Columns:
        per_token = self.ms * rng.lognormal(0.0, self.sd, n)
        output = np.maximum(2, np.round(rng.lognormal(math.log(200), 0.6, n))).astype(int)
        prompt = np.maximum(1, np.round(rng.lognormal(math.log(400), 0.8, n))).astype(int)
        jitter = rng.lognormal(0.0, 0.2 if self.ttft_spread else 0.05, n)
        ttft = (20.0 + 0.15 * prompt) * jitter if self.ttft_spread else 50.0 * jitter
        inflight = 1 + rng.poisson(0.5, n)
        drafted = 4 * np.maximum(1, output // 3)
        return Columns(per_token, output, prompt, ttft, drafted, rng.binomial(drafted, 0.6), inflight)


@dataclass(frozen=True, slots=True)
class Measured:
    """Requests measured on a real pair (benchmarks/rollout_pair.py), one side's: drawn whole, with replacement.

    Each drawn request keeps its own decode ms per token, lengths, TTFT, draft counts and load
    together, so whatever ties them in the real requests stays tied.
    """

    per_token: tuple[float, ...]
    output: tuple[int, ...]
    prompt: tuple[int, ...]
    ttft: tuple[float, ...]
    drafted: tuple[int, ...]
    accepted: tuple[int, ...]
    inflight: tuple[int, ...]

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> Measured:
        """The timed requests among ``records`` (a decode time per token and a TTFT)."""
        timed = [r for r in records if r.decode_ms_per_token is not None and r.ttft_ms is not None]
        if not timed:
            raise ValueError("no timed request to draw from")
        return cls(
            tuple(float(r.decode_ms_per_token or 0.0) for r in timed),
            tuple(r.output_tokens for r in timed),
            tuple(r.prompt_tokens for r in timed),
            tuple(float(r.ttft_ms or 0.0) for r in timed),
            tuple(r.num_draft_tokens for r in timed),
            tuple(r.num_accepted_tokens for r in timed),
            tuple(r.upstream_inflight or 1 for r in timed),
        )

    def draw(self, rng: np.random.Generator, n: int) -> Columns:
        pick = rng.integers(0, len(self.per_token), n)
        columns = (self.per_token, self.output, self.prompt, self.ttft, self.drafted, self.accepted, self.inflight)
        return Columns(*(np.asarray(column)[pick] for column in columns))


@dataclass(frozen=True, slots=True)
class Scenario:
    """One row: a candidate at ``speed`` times the current drafter's decode speed on a workload of ``per_interval``
    requests per interval (both sides together), judged step by step with ``steps``; ``whole``: the whole rollout,
    else its first step only. ``measured``: the candidate's and the current drafter's requests drawn from real ones
    (``speed`` and ``sd`` then only describe them), else from the model."""

    name: str
    speed: float
    per_interval: int
    steps: tuple[float, ...]
    sd: float
    runs: int
    whole: bool = False
    ttft_spread: bool = True  # TTFT linear in the prompt (log sd about 0.8); False: 50 ms, log sd 0.05
    measured: tuple[Measured, Measured] | None = None

    @property
    def a_side(self) -> str:
        """The first step's requests per interval: candidate / current."""
        n = round(self.per_interval * self.steps[0])
        return f"{n} / {self.per_interval - n}"

    def sources(self) -> tuple[Modelled | Measured, Modelled | Measured]:
        """Where the candidate's and the current drafter's requests come from."""
        if self.measured is not None:
            return self.measured
        return (Modelled(MS_PER_TOKEN / self.speed, self.sd, self.ttft_spread),
                Modelled(MS_PER_TOKEN, self.sd, self.ttft_spread))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Judging:
    """The judge's settings for every row."""

    tolerance: float = 0.05
    min_requests: int = 30
    ci: float = RolloutSettings().ci_level


@dataclass(frozen=True, slots=True)
class Run:
    """What one simulated rollout came to, and when (minutes since it started)."""

    outcome: str  # advanced | failed | gave_up | promoted | open
    minute: int
    candidate_served: int  # the candidate's requests started before the decision
    step: int  # the step it ended at (whole rollouts)
    first_judged: int | None  # the first minute at which the judge judged the workload (not unjudged)
    held_by: tuple[str, ...] = ()  # per held event: what did not pass (metric names, or "unjudged")
    reason: str = ""
    cpu_s: float = 0.0


def side_requests(
    rng: np.random.Generator,
    drafter: str,
    per_interval: int,
    start_s: float,
    intervals: int,
    source: Modelled | Measured,
    tag: str,
) -> list[RequestRecord]:
    """``per_interval`` requests in each of ``intervals`` intervals from ``start_s`` (seconds after T0)."""
    if per_interval <= 0:
        return []
    length = INTERVAL.total_seconds()
    start = np.concatenate([np.sort(rng.uniform(k * length, (k + 1) * length, per_interval)) for k in range(intervals)])
    c = source.draw(rng, len(start))
    decode = c.per_token * (c.output - 1)
    return [
        RequestRecord(
            request_id=f"{tag}-{drafter}-{i}",
            ts_start=T0 + timedelta(seconds=start_s + float(start[i])),
            ts_end=T0 + timedelta(seconds=start_s + float(start[i] + (c.ttft[i] + decode[i]) / 1000.0)),
            workload=WORKLOAD,
            target_model=TARGET,
            drafter=drafter,
            mode="speculative",
            prompt_tokens=int(c.prompt[i]),
            output_tokens=int(c.output[i]),
            num_draft_tokens=int(c.drafted[i]),
            num_accepted_tokens=int(c.accepted[i]),
            ttft_ms=float(c.ttft[i]),
            latency_ms=float(c.ttft[i] + decode[i]),
            decode_ms=float(decode[i]),
            finish_reason="stop",
            source="api",
            upstream_inflight=int(c.inflight[i]),
        )
        for i in range(len(start))
    ]


def run_rollout(template: Path, folder: Path, scenario: Scenario, judging: Judging, seed: int) -> Run:
    """One seeded rollout on a store of its own, judged every minute until it ends (or its first step does)."""
    rng = np.random.default_rng(seed)
    settings = RolloutSettings(
        steps=scenario.steps,
        interval=INTERVAL,
        tolerance=judging.tolerance,
        min_requests=judging.min_requests,
        ci_level=judging.ci,
        max_holds=MAX_HOLDS,
        drafter=CANDIDATE,
    )
    horizon = MAX_HOLDS + 1  # intervals a step can last
    tag = f"s{seed}"
    path = folder / f"{tag}.sqlite"
    shutil.copyfile(template, path)
    engine = create_engine(f"sqlite:///{path}")
    held: list[str] = []
    served: list[datetime] = []  # the candidate's requests' starts, every step
    pending: list[RequestRecord] = []
    step, minute, first = -1, 0, None
    cpu = time.process_time()
    try:
        r = start_rollout(engine, PROXY, settings, T0)
        assert r.id is not None
        last = (MAX_HOLDS + 1) * len(scenario.steps) * int(INTERVAL / LOOK) + 1
        for minute in range(1, last + 1):
            now = T0 + minute * LOOK
            current = get_rollout(engine, r.id)
            assert current is not None
            if current.step != step:  # a new step: its share of the traffic from now on
                step = current.step
                started = (current.step_started_at - T0).total_seconds()
                pending = [p for p in pending if p.ts_start < current.step_started_at]
                n = round(scenario.per_interval * scenario.steps[step])
                candidate, incumbent = scenario.sources()
                fresh = side_requests(rng, CANDIDATE, n, started, horizon, candidate, f"{tag}-{step}")
                served += [q.ts_start for q in fresh]
                pending += fresh
                rest = scenario.per_interval - n
                pending += side_requests(rng, CURRENT_DRAFTER, rest, started, horizon, incumbent, f"{tag}-{step}")
            ended = [p for p in pending if p.ts_end <= now]  # a record reaches the store when its request ends
            if ended:
                pending = [p for p in pending if p.ts_end > now]
                with engine.begin() as conn:
                    write_batch(conn, ended, f"{tag}-m{minute}", "sync")
            events = advance_rollouts(engine, settings, now)
            if first is None and _judged(engine, r.id):
                first = minute
            for event in events:
                judged = event.judgement.get("workloads", {}).get(WORKLOAD, {})
                if event.kind == "held":
                    held.append(_not_passing(judged))
                if event.kind not in ("advanced", "rolled_back", "promoted"):
                    continue
                before = sum(1 for s in served if s < now)
                if event.kind == "advanced" and scenario.whole:
                    continue
                # A first step passed is "advanced" whether the next step is another or the promotion.
                passed = "promoted" if event.kind == "promoted" and scenario.whole else "advanced"
                outcome = passed if event.kind in ("advanced", "promoted") else "failed"
                if event.kind == "rolled_back" and ("no decision" in event.reason or "on no workload" in event.reason):
                    outcome = "gave_up"
                return Run(
                    outcome, minute, before, event.step, first, tuple(held), event.reason, time.process_time() - cpu
                )
        return Run("open", minute, len(served), step, first, tuple(held), "", time.process_time() - cpu)
    finally:
        engine.dispose()
        path.unlink(missing_ok=True)


def _not_passing(judged: dict[str, Any]) -> str:
    """What kept a held workload from passing: ``unjudged``, or its metrics that did not pass."""
    if judged.get("outcome") == "unjudged":
        return "unjudged"
    return "+".join(m["metric"] for m in judged.get("metrics", ()) if m["outcome"] not in ("pass", None))


def _judged(engine: Engine, rollout_id: int) -> bool:
    """Whether the rollout job's last run judged the workload (the judgement it stored with the rollout)."""
    stored = get_rollout(engine, rollout_id)
    state = stored.judgement.get("workloads", {}).get(WORKLOAD, {}) if stored is not None else {}
    return bool(state) and state.get("outcome") != "unjudged"


def _task(args: tuple[Path, Path, Scenario, Judging, int]) -> Run:
    logging.getLogger("monitor.proxy.rollout").setLevel(logging.ERROR)  # a line per rollback otherwise
    return run_rollout(*args)


def migrated(folder: Path) -> Path:
    path = folder / "template.sqlite"
    engine = create_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()
    return path


def scenarios(quick: bool) -> list[Scenario]:
    """The rows: the issue's case (30 a side), the first default step, a busy workload, the spread's effect."""

    def runs(n: int) -> int:
        return max(4, n // 25) if quick else n

    half = (0.5, 1.0)
    return [
        Scenario("A/A", 1.0, 60, half, 0.25, runs(400)),
        Scenario("20 % slower", 0.8, 60, half, 0.25, runs(200)),
        Scenario("10 % slower", 0.9, 60, half, 0.25, runs(100)),
        Scenario("5 % faster", 1.05, 60, half, 0.25, runs(100)),
        Scenario("A/A, TTFT alike", 1.0, 60, half, 0.25, runs(100), ttft_spread=False),
        Scenario("A/A, first default step", 1.0, 600, (0.05, 1.0), 0.25, runs(60)),
        Scenario("20 % slower, first default step", 0.8, 600, (0.05, 1.0), 0.25, runs(60)),
        Scenario("A/A, busy", 1.0, 600, half, 0.25, runs(60)),
        Scenario("20 % slower, busy", 0.8, 600, half, 0.25, runs(100)),
        Scenario("A/A, sd 0.15", 1.0, 60, half, 0.15, runs(60)),
        Scenario("20 % slower, sd 0.15", 0.8, 60, half, 0.15, runs(100)),
        Scenario("A/A, sd 0.35", 1.0, 60, half, 0.35, runs(60)),
        Scenario("20 % slower, sd 0.35", 0.8, 60, half, 0.35, runs(100)),
        Scenario("A/A, whole default rollout", 1.0, 600, DEFAULT_STEPS, 0.25, 2 if quick else 4, whole=True),
    ]


def exact_ci(k: int, n: int) -> tuple[float, float]:
    """Clopper-Pearson 95 % interval of k in n."""
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
    return float(ci.low), float(ci.high)


def rate_ci(k: int, exposure: float) -> tuple[float, float]:
    """Exact (Poisson, Garwood) 95 % interval of a rate: k events in ``exposure`` units of time."""
    low = stats.chi2.ppf(0.025, 2 * k) / 2 if k else 0.0
    return float(low / exposure), float(stats.chi2.ppf(0.975, 2 * k + 2) / 2 / exposure)


def pct(k: int, n: int, interval: bool = False) -> str:
    if n == 0:
        return "–"
    if not interval:
        return f"{k / n:.1%}"
    low, high = exact_ci(k, n)
    return f"{k / n:.1%} [{low:.1%}, {high:.1%}]"


def quantiles(values: Sequence[float]) -> str:
    """median / p95, or a dash."""
    if not values:
        return "–"
    return f"{np.median(values):.0f} / {np.quantile(values, 0.95):.0f}"


@dataclass(frozen=True, slots=True)
class Figures:
    """One row's figures, from its runs."""

    scenario: Scenario
    runs: list[Run]

    def count(self, *outcomes: str, by_minute: float = math.inf) -> int:
        return sum(1 for r in self.runs if r.outcome in outcomes and r.minute <= by_minute)

    @property
    def intervals(self) -> float:
        """The steps' time under judgement, in intervals (a step decided at minute 45 counts 1.5)."""
        return sum(r.minute for r in self.runs) / (INTERVAL / LOOK)

    def minutes(self, *outcomes: str) -> list[float]:
        return [float(r.minute) for r in self.runs if r.outcome in outcomes]

    def at_first_judgement(self) -> int:
        """Rolled back by the first run of the rollout job that judged the workload."""
        return sum(1 for r in self.runs if r.outcome == "failed" and r.minute == r.first_judged)

    def held(self) -> str:
        counts = Counter(h for r in self.runs for h in r.held_by)
        return ", ".join(f"{k} {v}" for k, v in counts.most_common()) or "none"

    @property
    def cpu_s(self) -> float:
        return sum(r.cpu_s for r in self.runs)


def step_table(rows: Sequence[Figures], min_requests: int) -> list[str]:
    per = INTERVAL / LOOK
    lines = [
        "| row | speed | sd | requests per interval, candidate / current | steps | advanced | rolled back: critical "
        "fail | rolled back: no decision | first judged at minute (median) | failed at the first judgement | "
        "rolled back by the end of interval 1 / 2 | minutes to advance (median / p95) | minutes to rollback "
        f"(median / p95) | candidate requests before the rollback (median / p95; ÷ min_requests {min_requests}) |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for f in rows:
        s, n = f.scenario, len(f.runs)
        rolled = [r for r in f.runs if r.outcome in ("failed", "gave_up")]
        served = [float(r.candidate_served) for r in rolled]
        ratio = ""
        if served:
            ratio = f" ({np.median(served) / min_requests:.2f}× / {np.quantile(served, 0.95) / min_requests:.2f}×)"
        first = [float(r.first_judged) for r in f.runs if r.first_judged is not None]
        back = " / ".join(pct(f.count("failed", "gave_up", by_minute=k * per), n) for k in (1, 2))
        lines.append(
            f"| {s.name} | {s.speed:.2f}× | {s.sd:g} | {s.a_side} | {n} | {pct(f.count('advanced'), n)} | "
            f"{pct(f.count('failed'), n)} | {pct(f.count('gave_up'), n)} | "
            f"{np.median(first) if first else '–'} | {pct(f.at_first_judgement(), n)} | {back} | "
            f"{quantiles(f.minutes('advanced'))} | {quantiles(f.minutes('failed', 'gave_up'))} | "
            f"{quantiles(served)}{ratio} |"
        )
    return lines


def aa_table(rows: Sequence[Figures]) -> list[str]:
    lines = [
        "| A/A row | sd | requests per interval, candidate / current | steps | intervals judged | false rollbacks "
        "(critical fail) per interval [95 % CI] | per step [95 % CI] | rolled back, no decision, per step [95 % CI] "
        "| holds, by what did not pass |",
        "| --- | ---: | --- | ---: | ---: | --- | --- | --- | --- |",
    ]
    for f in rows:
        s, n = f.scenario, len(f.runs)
        fails = f.count("failed")
        low, high = rate_ci(fails, f.intervals)
        lines.append(
            f"| {s.name} | {s.sd:g} | {s.a_side} | {n} | {f.intervals:.0f} | {fails / f.intervals:.1%} "
            f"[{low:.1%}, {high:.1%}] | {pct(fails, n, True)} | {pct(f.count('gave_up'), n, True)} | {f.held()} |"
        )
    return lines


def targets(figures: Sequence[Figures], judging: Judging) -> list[str]:
    """Issue 39's targets against the rows "A/A" and "20 % slower" (30 a side per interval), where they were run."""
    by_name = {f.scenario.name: f for f in figures}
    out = []
    if (aa := by_name.get("A/A")) is not None:
        fails = aa.count("failed")
        low, high = rate_ci(fails, aa.intervals)
        met = (
            "met"
            if high <= 0.01
            else "not shown (the interval reaches above 1 %)"
            if fails / aa.intervals <= 0.01
            else "missed"
        )
        out.append(
            f"Target: under no change at most 1 % of intervals fail: {fails / aa.intervals:.1%} of intervals "
            f"[{low:.1%}, {high:.1%}], {pct(fails, len(aa.runs))} of steps: {met}."
        )
    if (slow := by_name.get("20 % slower")) is not None:
        n, per = len(slow.runs), INTERVAL / LOOK
        caught = slow.count("failed", "gave_up", by_minute=2 * per)
        low, _ = exact_ci(caught, n)
        out.append(
            f"Target: a candidate 20 % slower caught within two intervals in at least 95 % at 30 requests a side: "
            f"{pct(caught, n)} (95 % CI from {low:.1%}): {'met' if caught / n >= 0.95 else 'missed'}."
        )
        served = [r.candidate_served for r in slow.runs if r.outcome in ("failed", "gave_up")]
        if served:
            p95 = float(np.quantile(served, 0.95)) / judging.min_requests
            median = float(np.median(served)) / judging.min_requests
            out.append(
                f"Target: a losing candidate's requests before its rollback at most twice the judge's minimum "
                f"({2 * judging.min_requests}): median {median:.2f}×, p95 {p95:.2f}×: "
                f"{'met' if p95 <= 2 else 'met at the median, not at p95' if median <= 2 else 'missed'}."
            )
    return [" ".join(out)] if out else []


def simulate(rows: Sequence[tuple[int, Scenario]], judging: Judging, seed: int, jobs: int) -> list[Figures]:
    """Every row's rollouts on ``jobs`` processes; row ``k``'s seeds follow from ``seed`` and ``k`` alone."""
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(max(1, jobs)) as pool:
        folder = Path(tmp)
        template = migrated(folder)
        tasks = [
            (template, folder, s, judging, seed * 1_000_003 + 10_007 * k + i) for k, s in rows for i in range(s.runs)
        ]
        done = list(pool.map(_task, tasks, chunksize=4))
    figures, at = [], 0
    for _, s in rows:
        figures.append(Figures(s, done[at : at + s.runs]))
        at += s.runs
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few seeds per row, to check it works (no write)")
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS.md")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: the CPU count)")
    parser.add_argument("--seed", type=int, default=2026, help="the seeds are derived from it (default 2026)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="rollout.tolerance (default 0.05)")
    parser.add_argument("--min-requests", type=int, default=30, help="rollout.min_requests (default 30)")
    parser.add_argument(
        "--ci",
        type=float,
        default=RolloutSettings().ci_level,
        help="the judge's interval level, rollout.ci_level (default %(default)s)",
    )
    parser.add_argument("--only", nargs="+", metavar="ROW", help="only these rows (their names, quoted)")
    args = parser.parse_args(argv)
    judging = Judging(args.tolerance, args.min_requests, args.ci)
    # Each row's seeds follow from --seed and its place in the full list: --only picks rows, not other seeds.
    rows = [(k, s) for k, s in enumerate(scenarios(args.quick)) if not args.only or s.name in args.only]
    t0, load = time.perf_counter(), os.getloadavg()
    figures = simulate(rows, judging, args.seed, args.jobs)
    done = [r for f in figures for r in f.runs]
    took = time.perf_counter() - t0
    steps = [f for f in figures if not f.scenario.whole]
    whole = [f for f in figures if f.scenario.whole]
    lines = [
        f"Simulation (not production data) through the real code path: a SQLite store per rollout, records written "
        f"with write_batch when each request ends, `advance_rollouts` every simulated minute. Judge: tolerance "
        f"{judging.tolerance:g}, min_requests {judging.min_requests}, interval level {judging.ci:g}; "
        f"rollout.interval {INTERVAL.total_seconds() / 60:g} min, max_holds {MAX_HOLDS}. Per-request decode ms "
        "per token lognormal (log sd in the rows), the candidate's median the current's ÷ its speed; requests a "
        "side fixed per interval, start times uniform; TTFT, lengths and load alike on both sides. Each row but "
        "the last runs a rollout's first step (share 50 %, or 5 % for 'first default step') until it advances "
        "or is rolled back.",
        "",
        *step_table(steps, judging.min_requests),
        "",
        *aa_table([f for f in steps if f.scenario.speed == 1.0]),
    ]
    for f in whole:
        ended = Counter(
            f"{r.outcome.replace('_', ' ')} at step {r.step + 1} of {len(f.scenario.steps)}" for r in f.runs
        )
        reasons = sorted({r.reason[:240] for r in f.runs})
        lines += [
            "",
            f"{f.scenario.name}: steps {', '.join(f'{100 * s:g} %' for s in f.scenario.steps)}, "
            f"{f.scenario.per_interval} requests per interval, {len(f.runs)} runs: "
            + ", ".join(f"{k}: {v}" for k, v in sorted(ended.items()))
            + f"; ended at minute {quantiles(f.minutes('promoted', 'failed', 'gave_up', 'open'))} (median / p95). "
            + "Reasons: "
            + " | ".join(f"“{r}”" for r in reasons),
        ]
    for f in figures:
        print(f"{f.scenario.name}: {f.cpu_s:.0f} CPU s", file=sys.stderr)
    lines += ["", *targets(figures, judging)]
    lines += [
        "",
        f"{len(done)} simulated rollouts on {args.jobs} processes; took {took:.0f} s (load average, 1 min, at start / "
        f"end: {load[0]:.1f} / {os.getloadavg()[0]:.1f}). Every rate, minute and count above is the simulation's and "
        "the same on any machine and under any load for the same --seed; only the time taken depends on them.",
    ]
    body = "\n".join(lines)
    print(body)
    if not (args.no_write or args.quick):
        write_section(TITLE, body, ["-m", "benchmarks.rollout", *(argv if argv is not None else sys.argv[1:])])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
