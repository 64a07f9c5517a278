"""One drift run: every test for every workload and pair with data, BH across the run, results stored.

:func:`run_drift` is what the CLI, the scheduler and the API call. Reads are bounded (rollup counts
plus hash samples of at most ``sample_size`` requests per window, workload and pair), so a run over
a million stored requests takes seconds (``benchmarks/drift_speed.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import insert
from sqlalchemy.engine import Connection, Engine

from monitor.drift.detectors.acceptance import AcceptanceDrift
from monitor.drift.detectors.acceptance_by_length import acceptance_by_length
from monitor.drift.detectors.latency import METRICS as LATENCY_METRICS
from monitor.drift.detectors.latency import LatencyRegression
from monitor.drift.detectors.net_loss import NetLoss, Population
from monitor.drift.detectors.online import update_detector
from monitor.drift.detectors.prompt_length import PromptLengthShift
from monitor.drift.detectors.scraped import scraped_tests
from monitor.drift.detectors.traffic_mix import TrafficMixDrift
from monitor.drift.explain import ACCEPTANCE, DECODE_SPEED, Explanation, Metric, Stratum, explain, sentence
from monitor.drift.explain_factors import Requests, split_named
from monitor.drift.explain_read import factor_requests, sample_strata, split_strata
from monitor.drift.models import DriftResultRow, DriftRunRow
from monitor.drift.result import DriftResult, apply_bh
from monitor.drift.sampling import Sample, WindowCounts, sample_requests, window_counts
from monitor.drift.settings import DriftSettings
from monitor.drift.windows import Windows, rolling_windows, utc, workload_windows
from monitor.settings.parsers import format_duration
from monitor.store.reads.results import Pair
from monitor.store.types import Fence

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DriftRun:
    """The outcome of one run; ``windows`` are the default (rolling) windows."""

    run_id: str
    started_at: datetime
    finished_at: datetime
    windows: Windows
    level: float
    results: list[DriftResult] = field(default_factory=list)
    # Why pooled acceptance changed between the default windows (None: the run did not split it).
    explanation: Explanation | None = None
    # Why acceptance changed in each workload tested over windows of its own, over those windows.
    own_splits: dict[str, tuple[Windows, Explanation]] = field(default_factory=dict)
    # The same for decode time per token (speculative requests), over the same windows.
    speed: Explanation | None = None
    own_speed: dict[str, tuple[Windows, Explanation]] = field(default_factory=dict)

    @property
    def drifts(self) -> list[DriftResult]:
        return [r for r in self.results if r.decision == "drift"]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(),
            "level": self.level,
            "windows": _windows_json(self.windows),
            "results": [r.to_json() for r in self.results],
            "acceptance_split": self.split_json(),
            "speed_split": self.speed_json(),
        }

    def split_json(self) -> dict[str, Any] | None:
        """The run's split as stored and served: the default windows', with ``workloads`` for those of their own."""
        return _split_json(self.explanation, self.own_splits)

    def speed_json(self) -> dict[str, Any] | None:
        """The split of decode time per token, as :meth:`split_json`."""
        return _split_json(self.speed, self.own_speed)


def _split_json(explanation: Explanation | None, own: dict[str, tuple[Windows, Explanation]]) -> dict[str, Any] | None:
    if explanation is None:
        return None
    workloads = {
        workload: {**e.to_json(), "windows": _windows_json(windows), "note": windows.note}
        for workload, (windows, e) in sorted(own.items())
    }
    return {**explanation.to_json(), "workloads": workloads}


def _windows_json(w: Windows) -> dict[str, list[str]]:
    return {
        "reference": [w.ref_start.isoformat(), w.ref_end.isoformat()],
        "current": [w.cur_start.isoformat(), w.cur_end.isoformat()],
    }


def _seed(seed: int, *parts: object) -> int:
    # A stable seed per test and workload: reruns on the same data give the same intervals.
    return seed ^ zlib.crc32("|".join(map(str, parts)).encode())


@dataclass(slots=True)
class _RunReads:
    """What one run reads once and every workload shares, rather than once per workload."""

    # The version-adjusted windows of a pair (its models' version changes; pinned baselines are per workload).
    windows: dict[Pair, Windows] = field(default_factory=dict)
    # The net-loss fallback: all plain and holdout requests of a target model, by (target, start, end).
    plain: dict[tuple[str, datetime, datetime], Sample] = field(default_factory=dict)
    # Samples read over the default windows, by (workload, pair): the acceptance split uses them as they are.
    split: dict[tuple[str, Pair], tuple[Sample, Sample]] = field(default_factory=dict)
    # A workload tested over windows of its own (a pinned baseline, a version change, a widened current
    # window): those windows and each pair's samples there, split on their own so that its alert explains
    # the finding it reports rather than a comparison it did not make.
    own: dict[str, tuple[Windows, list[tuple[Sample, Sample]]]] = field(default_factory=dict)

    def keep(self, base: Windows, workload: str, pair: Pair, windows: Windows, ref: Sample, cur: Sample) -> None:
        if dataclasses.replace(windows, note=None) == base:
            self.split[(workload, pair)] = (ref, cur)
            return
        own = self.own.setdefault(workload, (windows, []))
        if own[0] == windows:  # a workload's other pairs over other windows (their own version change): not split
            own[1].append((ref, cur))


def _samples(
    conn: Connection, config: DriftSettings, base: Windows, workload: str, pair: Pair, only_pair: bool, reads: _RunReads
) -> tuple[Windows, Sample, Sample]:
    """The workload's windows (``base`` adjusted, the current one widened at low volume) and its samples there."""
    windows = workload_windows(conn, base, workload, pair, reads.windows)
    windows, cur = _current(conn, config, windows, workload, pair, only_pair)
    ref = sample_requests(
        conn, workload, pair, windows.ref_start, windows.ref_end, config.sample_size, only_pair=only_pair
    )
    reads.keep(base, workload, pair, windows, ref, cur)
    return windows, ref, cur


def _pairs(counts: WindowCounts) -> list[tuple[str, Pair, bool]]:
    """(workload, pair, whether it is the workload's only pair) of each pair that speculated in either window."""
    keys = set(counts.ref) | set(counts.cur)
    combos = {k for c in (counts.ref, counts.cur) for k, modes in c.items() if modes.get("speculative")}
    return [(w, pair, all(p == pair for v, p in keys if v == w)) for w, pair in sorted(combos)]


def _workload_tests(
    conn: Connection,
    config: DriftSettings,
    base: Windows,
    workload: str,
    pair: Pair,
    seed: int,
    only_pair: bool,
    reads: _RunReads,
) -> list[DriftResult]:
    windows, ref, cur = _samples(conn, config, base, workload, pair, only_pair, reads)
    common: dict[str, Any] = {"min_requests": config.min_requests, "ci_level": config.ci_level}

    def floor(key: str) -> float:
        return config.floor(workload, key)

    def s(test: str) -> int:
        return _seed(seed, workload, pair.label, test)

    spec_ref, spec_cur = ref.where(ref.mode == "speculative"), cur.where(cur.mode == "speculative")
    drafting_ref, drafting_cur = spec_ref.where(spec_ref.drafted > 0), spec_cur.where(spec_cur.drafted > 0)
    ref_rates, cur_rates = drafting_ref.accepted / drafting_ref.drafted, drafting_cur.accepted / drafting_cur.drafted
    results = [AcceptanceDrift(floor=floor("acceptance"), n_boot=config.n_boot, **common).compare(ref_rates, cur_rates)]
    results += acceptance_by_length(
        drafting_ref.prompt_tokens,
        ref_rates,
        drafting_cur.prompt_tokens,
        cur_rates,
        floor=floor("acceptance"),
        n_boot=config.n_boot,
        **common,
    )
    for metric in LATENCY_METRICS:
        test = LatencyRegression(metric, floor=floor("latency"), n_boot=config.n_boot, seed=s(metric), **common)
        results.append(test.compare(_latency(spec_ref, metric), _latency(spec_cur, metric)))
    results.append(
        PromptLengthShift(floor=floor("psi"), n_boot=config.n_boot, **common).compare(
            ref.prompt_tokens, cur.prompt_tokens
        )
    )
    results.append(_net_loss(conn, config, windows, workload, pair, cur, spec_cur, only_pair, reads.plain))
    return [
        r.replace(
            workload=workload,
            pair=pair.label,
            note="; ".join(filter(None, [windows.note, r.note])) or None,
            ref_start=windows.ref_start,
            ref_end=windows.ref_end,
            cur_start=windows.cur_start,
            cur_end=windows.cur_end,
        )
        for r in results
    ]


def _current(
    conn: Connection, config: DriftSettings, windows: Windows, workload: str, pair: Pair, only_pair: bool
) -> tuple[Windows, Sample]:
    """The current window's sample, widened (doubling, the reference moving with it) at low volume.

    A workload with fewer than ``min_requests`` speculative requests in the current window looks
    further back, up to ``max_current_window``, rather than staying ``insufficient_data`` run after
    run. Each run still tests each workload once, so BH's control over the run is unchanged; the
    price is a slower reaction, which the note states. Windows moved by a version change or a
    pinned baseline are not widened: they must not reach across the boundary they were set at.
    """
    cur = sample_requests(
        conn, workload, pair, windows.cur_start, windows.cur_end, config.sample_size, only_pair=only_pair
    )
    if windows.note is not None:
        return windows, cur
    length, reference = windows.cur_end - windows.cur_start, windows.ref_end - windows.ref_start
    span = length
    while _speculative(cur) < config.min_requests and span < config.max_current_window:
        span = min(2 * span, config.max_current_window)
        start = windows.cur_end - span
        note = (
            f"current window widened to {format_duration(span)}: fewer than {config.min_requests} "
            f"speculative requests in the last {format_duration(length)}"
        )
        windows = Windows(start - reference, start, start, windows.cur_end, note)
        cur = sample_requests(conn, workload, pair, start, windows.cur_end, config.sample_size, only_pair=only_pair)
    return windows, cur


def _speculative(sample: Sample) -> int:
    return int(((sample.mode == "speculative") & (sample.drafted > 0)).sum())


def _latency(sample: Sample, metric: str) -> np.ndarray[Any, np.dtype[np.float64]]:
    values = sample.decode_ms_per_token if metric == "ms_per_token" else getattr(sample, metric)
    return np.asarray(values[np.isfinite(values)], dtype=float)


def _net_loss(
    conn: Connection,
    config: DriftSettings,
    windows: Windows,
    workload: str,
    pair: Pair,
    cur: Sample,
    spec: Sample,
    only_pair: bool,
    plain_samples: dict[tuple[str, datetime, datetime], Sample],
) -> DriftResult:
    test = NetLoss(min_requests=config.min_requests, min_holdout=config.min_holdout, n_boot=config.n_boot)
    holdout = cur.where(cur.mode == "holdout")
    # With a single pair and a sample that holds the whole window, the sample has every holdout request.
    complete = only_pair and len(cur) < config.sample_size
    if len(holdout) < config.min_holdout and not complete:
        # Holdout is a small share of traffic: the mixed sample may hold few; read it on its own.
        start, end = windows.cur_start, windows.cur_end
        size = config.sample_size
        holdout = sample_requests(conn, workload, pair, start, end, size, mode="holdout", any_drafter=True)
    speculative, held = Population.timed(spec), Population.timed(holdout)
    measured = test.measured(speculative, held)
    if measured.decision != "insufficient_data":
        return measured
    # Too little comparable holdout for the workload: compare with all of the target's plain decoding.
    # That read spans every workload and drafter, so one run reads it once per target and window.
    key = (pair.target_model, windows.ref_start, windows.cur_end)
    plain = plain_samples.get(key)
    if plain is None:
        plain = plain_samples[key] = sample_requests(
            conn,
            None,
            pair,
            windows.ref_start,
            windows.cur_end,
            config.sample_size,
            mode=("holdout", "plain"),
            any_drafter=True,
        )
    compared = Population.timed(plain)
    estimated = test.estimated(speculative, compared)
    # Where the workload's own baseline is there at another load, that is what the verdict says.
    chosen = measured if estimated.decision == "insufficient_data" and "inconclusive" in measured.detail else estimated
    if chosen.decision != "insufficient_data":
        return chosen
    sides = {
        "speculative": len(spec), "speculative_timed": len(speculative.ms), "min_speculative": config.min_requests,
        "holdout": len(holdout), "holdout_timed": len(held.ms), "plain": len(plain), "plain_timed": len(compared.ms),
        "min_plain": config.min_holdout,
    }  # fmt: skip
    # What each side held, so that the verdict names the side that is missing and what would fill it.
    return chosen.replace(detail={**chosen.detail, "sides": sides})


def run_drift(
    engine: Engine,
    config: DriftSettings | None = None,
    now: datetime | None = None,
    *,
    current: timedelta | None = None,
    reference: timedelta | None = None,
    store: bool = True,
    seed: int = 0,
    detectors: bool = True,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    fence: Fence | None = None,
) -> DriftRun:
    """Run every drift test once and (by default) store the results; returns the run.

    ``config`` is the ``drift.*`` section (default: the defaults); ``current`` and ``reference``
    override its window lengths; ``now`` (default: the clock) ends the current window.
    """
    config = config or DriftSettings()
    started = clock()
    t0 = time.perf_counter()
    now = utc(now) if now is not None else started
    base = rolling_windows(now, current or config.current_window, reference or config.reference_window)
    results: list[DriftResult] = []
    with engine.begin() as conn:
        counts = window_counts(conn, base.ref_start, base.cur_start, base.cur_end)
        mix = TrafficMixDrift(
            floor=config.floor(None, "mix"), min_requests=config.min_requests, n_boot=config.n_boot
        ).compare(counts.mix("ref"), counts.mix("cur"))
        results.append(
            mix.replace(ref_start=base.ref_start, ref_end=base.ref_end, cur_start=base.cur_start, cur_end=base.cur_end)
        )
        # Pairs that speculated in either window; plain and holdout traffic is read through them.
        reads = _RunReads()
        for workload, pair, only_pair in _pairs(counts):
            results += _workload_tests(conn, config, base, workload, pair, seed, only_pair, reads)
            if detectors:
                cap = config.detector_batch
                found = update_detector(conn, workload, pair, base.cur_start, base.cur_end, started, cap)
                results.append(found.replace(workload=workload, pair=pair.label))
        results += scraped_tests(conn, config, base)
        split_started = time.perf_counter()
        (explanation, own), (speed, own_speed) = _splits(conn, config, base, seed, reads, (ACCEPTANCE, DECODE_SPEED))
        split_s = time.perf_counter() - split_started
        # An alert's description is built from its results: each acceptance (decode speed) result carries
        # the sentence of its split, over the windows its own test compared.
        said = {ACCEPTANCE: _sentences(explanation, own), DECODE_SPEED: _sentences(speed, own_speed)}
        results = [_with(r, said) for r in results]
        results = apply_bh(results, config.fdr_level)
        run = DriftRun(
            str(uuid.uuid4()), started, clock(), base, config.fdr_level, results, explanation, own, speed, own_speed
        )
        if store:
            _store(conn, run, config)
        if fence is not None:
            # The scheduler's lease check, last in the transaction: a replica that lost the lease rolls back.
            fence(conn)
    elapsed = time.perf_counter() - t0
    log.info(
        "drift run %s: %d results, %d drift, %.2f s (the acceptance and speed splits %.2f s of it)",
        run.run_id, len(results), len(run.drifts), elapsed, split_s,
    )  # fmt: skip
    return run


def _splits(
    conn: Connection, config: DriftSettings, base: Windows, seed: int, reads: _RunReads, metrics: Sequence[Metric]
) -> list[tuple[Explanation, dict[str, tuple[Windows, Explanation]]]]:
    """Per metric, the run's split over its windows and each workload's over windows of its own."""
    strata = split_strata(conn, base, config.sample_size, reads.split, metrics)
    return [
        (
            _explain(conn, config, base, seed, strata[metric], metric),
            {
                workload: (windows, _explain_own(conn, config, workload, windows, samples, seed, metric))
                for workload, (windows, samples) in reads.own.items()
            },
        )
        for metric in metrics
    ]


def _sentences(explanation: Explanation, own: dict[str, tuple[Windows, Explanation]]) -> dict[str | None, str]:
    """The sentence a workload's result carries (None: a workload of the run's windows)."""
    return {None: sentence(explanation)} | {w: _own_sentence(w, windows, e) for w, (windows, e) in own.items()}


def _split_seed(seed: int, metric: Metric, *parts: str) -> int:
    return _seed(seed, f"{metric.key}_split", *parts)


def _explain(
    conn: Connection, config: DriftSettings, windows: Windows, seed: int, strata: list[Stratum], metric: Metric
) -> Explanation:
    """The split of ``metric`` over the strata, then Level 2 where a workload's within part is named."""
    explanation = explain(
        strata,
        min_requests=config.explain_min_requests,
        n_boot=config.n_boot,
        seed=_split_seed(seed, metric),
        fdr_level=config.fdr_level,
        metric=metric,
    )
    return _named(conn, config, windows, explanation, seed)


def _explain_own(
    conn: Connection,
    config: DriftSettings,
    workload: str,
    windows: Windows,
    samples: list[tuple[Sample, Sample]],
    seed: int,
    metric: Metric = ACCEPTANCE,
) -> Explanation:
    """One workload's split over its own windows: its within part is the whole change, then Level 2."""
    explanation = explain(
        sample_strata(workload, samples, metric),
        min_requests=config.explain_min_requests,
        n_boot=config.n_boot,
        seed=_split_seed(seed, metric, "own", workload),
        fdr_level=config.fdr_level,
        metric=metric,
    )
    return _named(conn, config, windows, explanation, seed)


def _own_sentence(workload: str, windows: Windows, e: Explanation) -> str:
    """The split's sentence, and which windows it compared: the workload's own, not the run's."""
    return f"{sentence(e)} Over {workload}'s own windows: {windows.note}."


def _named(
    conn: Connection, config: DriftSettings, windows: Windows, explanation: Explanation, seed: int
) -> Explanation:
    # Level 2, only where a workload's own rate moved clear of noise: its within part over the factor groups.
    bounds = ((windows.ref_start, windows.ref_end), (windows.cur_start, windows.cur_end))

    def requests_of(workload: str) -> tuple[Requests, Requests]:
        size, metric = config.sample_size, explanation.metric
        ref, cur = (factor_requests(conn, workload, start, end, size, metric) for start, end in bounds)
        return ref, cur

    return split_named(
        explanation,
        requests_of,
        min_requests=config.explain_min_requests,
        n_boot=config.n_boot,
        seed_of=lambda workload: _split_seed(seed, explanation.metric, workload),
        fdr_level=config.fdr_level,
    )


def _with(result: DriftResult, said: dict[Metric, dict[str | None, str]]) -> DriftResult:
    """``result`` with the sentence of its metric's split, where it has one."""
    metric = ACCEPTANCE if result.metric.startswith("acceptance_rate") else None
    metric = DECODE_SPEED if result.metric == "ms_per_token" else metric
    if metric is None:
        return result
    sentences = said[metric]
    explanation = sentences.get(result.workload, sentences[None])
    return result.replace(detail={**result.detail, "explanation": explanation})


def explain_drift(
    engine: Engine,
    config: DriftSettings | None = None,
    now: datetime | None = None,
    *,
    current: timedelta | None = None,
    reference: timedelta | None = None,
    seed: int = 0,
    workload: str | None = None,
    metric: Metric = ACCEPTANCE,
) -> tuple[Windows, Explanation]:
    """The split of ``metric`` a drift run makes over the same windows (``run_drift``'s arguments), without the tests.

    With ``workload``, its parts only; a workload a run tests over windows of its own (a pinned
    baseline, a version change, a widened current window) is split over those, as its alert is.
    """
    config = config or DriftSettings()
    now = utc(now) if now is not None else datetime.now(UTC)
    windows = rolling_windows(now, current or config.current_window, reference or config.reference_window)
    with engine.connect() as conn:
        if workload is None:
            strata = split_strata(conn, windows, config.sample_size, {}, (metric,))[metric]
            return windows, _explain(conn, config, windows, seed, strata, metric)
        reads = _RunReads()
        counts = window_counts(conn, windows.ref_start, windows.cur_start, windows.cur_end)
        for name, pair, only_pair in _pairs(counts):
            if name == workload:
                _samples(conn, config, windows, workload, pair, only_pair, reads)
        if workload in reads.own:
            own, samples = reads.own[workload]
            return own, _explain_own(conn, config, workload, own, samples, seed, metric)
        strata = split_strata(conn, windows, config.sample_size, reads.split, (metric,))[metric]
        return windows, _explain(conn, config, windows, seed, strata, metric).for_workload(workload)


def _store(conn: Connection, run: DriftRun, config: DriftSettings) -> None:
    w = run.windows
    conn.execute(
        insert(DriftRunRow).values(
            run_id=run.run_id,
            started_at=run.started_at,
            finished_at=run.finished_at,
            ref_start=w.ref_start,
            ref_end=w.ref_end,
            cur_start=w.cur_start,
            cur_end=w.cur_end,
            level=run.level,
            n_results=len(run.results),
            n_drift=len(run.drifts),
            acceptance_split=run.split_json(),
            speed_split=run.speed_json(),
            params={
                "current_window_s": (w.cur_end - w.cur_start).total_seconds(),
                "reference_window_s": (w.ref_end - w.ref_start).total_seconds(),
                "min_requests": config.min_requests,
                "sample_size": config.sample_size,
                "floors": config.floors,
                "workload_floors": {
                    workload: {key: value for name, key, value in config.workload_floors if name == workload}
                    for workload, _, _ in config.workload_floors
                },
            },
        )
    )
    rows = [
        {
            "run_id": run.run_id,
            "created_at": run.started_at,
            **{k: getattr(r, k) for k in ("test", "workload", "pair", "metric", "n_ref", "n_cur", "decision", "note")},
            **{k: v for k, v in r.to_json().items() if k in ("statistic", "p", "q", "effect")},
            "ci_low": r.to_json()["ci"][0] if r.ci else None,
            "ci_high": r.to_json()["ci"][1] if r.ci else None,
            "detail": r.detail,
            "ref_start": r.ref_start,
            "ref_end": r.ref_end,
            "cur_start": r.cur_start,
            "cur_end": r.cur_end,
        }
        for r in run.results
    ]
    if rows:
        conn.execute(insert(DriftResultRow), rows)
