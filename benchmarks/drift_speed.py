"""How long one drift run takes over 1,000,000 stored requests in 20 workloads, SQLite and PostgreSQL.

    .venv/bin/python benchmarks/drift_speed.py [--rows 1000000] [--workloads 20] [--sqlite-only]

Rows are generated with numpy (Beta-Binomial-like acceptance, lognormal latencies, seven days,
every tenth request of a workload in holdout mode) and bulk-loaded: one prepared multi-row insert
on SQLite, COPY on PostgreSQL (a fresh database on 127.0.0.1:5432, dropped afterwards). The
per-minute rollups the run reads are then built in SQL from ``requests`` (``rollup_bins`` is not
filled: drift runs do not read it). Two runs are timed per database: windows covering all rows
(``--current 1d --reference 6d``: the worst case, every row is in a window) and the defaults
(1h against the day before). Beside each, the acceptance and speed splits' share of the run (from the
run's own log line; Level 1 only, since nothing changes in these streams), and what Level 2 costs for
one workload (its factor read of both windows and its split, of acceptance and of decode speed),
which a run pays for each workload whose within part is named.
"""

from __future__ import annotations

import argparse
import io
import logging
import math
import os
import re
import sqlite3
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from sqlalchemy.engine import Engine

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.generated_rows import WITHOUT_SPANS
from monitor.drift.explain import ACCEPTANCE, DECODE_SPEED, Metric
from monitor.drift.explain_factors import split_within
from monitor.drift.explain_read import factor_requests
from monitor.drift.run import run_drift
from monitor.drift.settings import DriftSettings
from monitor.drift.windows import rolling_windows
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade

START = datetime(2026, 3, 1, tzinfo=UTC)
HEADER = (
    "| database | windows | cache | run time (CPU of this process, load avg) | results | sampled (acceptance) "
    "| of it the acceptance and speed splits | Level 2, a workload more (acceptance / speed) |"
)
RULE = "| --- | --- | --- | --- | --- | --- | --- | --- |"
SPLIT_NOTE = (
    '"Of it the acceptance and speed splits": their seconds inside the run (its log line), Level 1 only, since '
    'nothing changes in these streams. "Level 2, a workload more": its factor read of both windows and its split '
    "for one workload, of acceptance and of decode speed, which a run adds for each workload whose within part is "
    "named."
)
DAYS = 7
COLUMNS = WITHOUT_SPANS
SUMS = """count(*), sum(case when finish_reason = 'error' then 1 else 0 end), sum(prompt_tokens), sum(output_tokens),
 sum(num_spec_steps), sum(num_draft_tokens), sum(num_accepted_tokens),
 sum(case when num_draft_tokens > 0 then 1 else 0 end),
 sum(case when num_draft_tokens > 0 then 1.0 * num_accepted_tokens / num_draft_tokens else 0 end),
 count(latency_ms), sum(latency_ms / output_tokens), sum(latency_ms), sum(output_tokens),
 count(ttft_ms), sum(ttft_ms)"""
ROLLUP_COLUMNS = """bucket, workload, target_model, drafter, draft_model, mode, n_requests, n_errors, sum_prompt_tokens,
 sum_output_tokens, sum_spec_steps, sum_draft_tokens, sum_accepted_tokens, n_drafting, sum_acceptance_rate, n_timed,
 sum_ms_per_token, sum_timed_latency_ms, sum_timed_output_tokens, n_ttft, sum_ttft_ms"""


def generate(n: int, n_workloads: int, seed: int = 0) -> dict[str, Any]:
    """Column arrays of ``n`` requests, round-robin over the workloads, evenly over seven days."""
    rng = np.random.default_rng(seed)
    workload = np.arange(n) % n_workloads
    alpha = np.linspace(0.35, 0.85, n_workloads)[workload]
    steps = 4 + rng.poisson(12, n)
    gamma = 4
    # Truncated geometric run lengths per step; the request's own alpha varies (Beta around the workload's).
    a = rng.beta(alpha * 20, (1 - alpha) * 20)
    hist = np.zeros((n, gamma + 1), dtype=np.int64)
    remaining = steps.copy()
    for j in range(gamma):
        p = 1 - a  # stop after j accepted drafts
        take = rng.binomial(remaining, p)
        hist[:, j] = take
        remaining -= take
    hist[:, gamma] = remaining
    accepted = hist @ np.arange(gamma + 1)
    per_position = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1][:, 1:]
    holdout = (np.arange(n) // n_workloads) % 10 == 0
    output = 1 + accepted + steps
    ms_per_token = rng.lognormal(np.log(25), 0.3, n) * np.where(holdout, 1.4, 1.0)
    latency = ms_per_token * output
    offsets = (np.arange(n) * (DAYS * 86_400e6 / n)).astype("timedelta64[us]")
    return {
        "workload": workload,
        "holdout": holdout,
        "steps": np.where(holdout, 0, steps),
        "hist": hist,
        "per_position": per_position,
        "accepted": np.where(holdout, 0, accepted),
        "output": output,
        "latency": latency,
        "ttft": rng.lognormal(np.log(60), 0.4, n),
        "prompt": np.round(rng.lognormal(np.log(200), 0.6, n)).astype(np.int64) + 1,
        "ts": np.datetime64(START.replace(tzinfo=None), "us") + offsets,
    }


def rows(data: dict[str, Any], sqlite_times: bool) -> list[tuple[Any, ...]]:
    ts = np.datetime_as_string(data["ts"], unit="us")
    end = np.datetime_as_string(data["ts"] + (data["latency"] * 1000).astype("timedelta64[us]"), unit="us")

    def fix(text: str) -> str:
        return text.replace("T", " ") if sqlite_times else text + "+00"

    ingested = fix(str(np.datetime64("2026-03-08T00:00:00.000000")))
    out = []
    for i in range(len(ts)):
        hold = bool(data["holdout"][i])
        h = data["hist"][i]
        pp = data["per_position"][i]
        steps = int(data["steps"][i])
        out.append(
            (
                f"bench-{i}",
                fix(ts[i]),
                fix(end[i]),
                f"wl{int(data['workload'][i]):02d}",
                "qwen-coder-1.5b",
                "model",
                "qwen-coder-0.5b",
                "v1",
                "v1",
                "holdout" if hold else "speculative",
                0 if hold else 4,
                int(data["prompt"][i]),
                int(data["output"][i]),
                steps,
                4 * steps,
                int(data["accepted"][i]),
                "[]" if hold else f"[{pp[0]},{pp[1]},{pp[2]},{pp[3]}]",
                "[]" if hold else f"[{h[0]},{h[1]},{h[2]},{h[3]},{h[4]}]",
                float(data["ttft"][i]),
                float(data["latency"][i]),
                0.0 if hold else float(data["latency"][i]) * 0.1,
                0.0 if hold else float(data["latency"][i]) * 0.8,
                0.0,
                1.0,
                "stop",
                "embedded",
                False if not sqlite_times else 0,
                ingested,
            )
        )
    return out


def load_sqlite(path: Path, data: dict[str, Any]) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    marks = ",".join("?" * len(COLUMNS))
    conn.executemany(f"INSERT INTO requests ({','.join(COLUMNS)}) VALUES ({marks})", rows(data, True))
    conn.execute(
        f"INSERT INTO rollup_minute ({ROLLUP_COLUMNS}) SELECT substr(ts_start, 1, 16) || ':00.000000', workload,"
        f" target_model, drafter, coalesce(draft_model, ''), mode, {SUMS} FROM requests"
        " GROUP BY 1, workload, target_model, drafter, draft_model, mode"
    )
    conn.commit()
    conn.execute("ANALYZE")
    conn.close()


def load_postgresql(dsn: str, data: dict[str, Any]) -> None:
    with psycopg.connect(dsn) as conn:
        with conn.cursor() as cur, cur.copy(f"COPY requests ({','.join(COLUMNS)}) FROM STDIN") as copy:
            buffer = io.StringIO()
            for i, row in enumerate(rows(data, False)):
                buffer.write("\t".join("t" if v is True else "f" if v is False else str(v) for v in row) + "\n")
                if i % 50_000 == 49_999:
                    copy.write(buffer.getvalue())
                    buffer = io.StringIO()
            copy.write(buffer.getvalue())
        conn.execute(
            f"INSERT INTO rollup_minute ({ROLLUP_COLUMNS}) SELECT date_trunc('minute', ts_start), workload,"
            f" target_model, drafter, coalesce(draft_model, ''), mode, {SUMS} FROM requests"
            " GROUP BY 1, workload, target_model, drafter, draft_model, mode"
        )
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


class SplitSeconds(logging.Handler):
    """The acceptance and speed splits' seconds, from the drift run's own log line."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = math.nan

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"the acceptance and speed splits ([0-9.]+) s", record.getMessage())
        if found:
            self.seconds = float(found.group(1))


def level2_seconds(
    engine: Engine, now: datetime, current: timedelta | None, reference: timedelta | None, metric: Metric
) -> float:
    """Level 2 for one workload over the run's windows, as a run pays it for each workload whose within part is
    named (none is here: the stored streams do not change): its factor read of both windows and its split."""
    settings = DriftSettings()
    windows = rolling_windows(now, current or settings.current_window, reference or settings.reference_window)
    t0 = time.perf_counter()
    with engine.connect() as conn:
        bounds = ((windows.ref_start, windows.ref_end), (windows.cur_start, windows.cur_end))
        ref, cur = (factor_requests(conn, "wl00", a, b, settings.sample_size, metric) for a, b in bounds)
    split_within((ref, cur), "wl00", 0.05, min_requests=30, n_boot=settings.n_boot, seed=0, fdr_level=0.01)
    return time.perf_counter() - t0


def time_runs(url: str, label: str) -> list[str]:
    engine = create_engine(url)
    now = START + timedelta(days=DAYS)
    lines = []
    for name, current, reference in (
        ("all rows in windows (1d + 6d)", timedelta(days=1), timedelta(days=6)),
        ("defaults (1h + 1d)", None, None),
    ):
        for attempt in range(2):  # the second run shows the warm-cache figure
            split = SplitSeconds()
            logger = logging.getLogger("monitor.drift.run")
            logger.setLevel(logging.INFO)
            logger.addHandler(split)
            t0, cpu0 = time.perf_counter(), time.process_time()
            run = run_drift(engine, DriftSettings(), now, current=current, reference=reference)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            logger.removeHandler(split)
            tested = sum(r.n_ref + r.n_cur for r in run.results if r.test == "acceptance")
            level1 = split.seconds
            level2 = [level2_seconds(engine, now, current, reference, metric) for metric in (ACCEPTANCE, DECODE_SPEED)]
            lines.append(
                f"| {label} | {name} | {'cold' if attempt == 0 else 'warm'} | {elapsed:.2f} s ({cpu:.2f} s CPU, "
                f"load {os.getloadavg()[0]:.1f}) | "
                f"{len(run.results)} | {tested} | {level1:.2f} s | {level2[0]:.2f} s / {level2[1]:.2f} s |"
            )
            print(lines[-1], flush=True)
    engine.dispose()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workloads", type=int, default=20)
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--write", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = parser.parse_args()
    table: list[str] = []
    t0 = time.perf_counter()
    data = generate(args.rows, args.workloads)
    print(f"generated {args.rows} rows in {time.perf_counter() - t0:.1f} s", flush=True)
    print(HEADER)
    print(RULE)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        engine = create_engine(f"sqlite:///{path}")
        upgrade(engine)
        engine.dispose()
        t0 = time.perf_counter()
        load_sqlite(path, data)
        print(f"(sqlite: loaded in {time.perf_counter() - t0:.1f} s)", flush=True)
        table += time_runs(f"sqlite:///{path}", "SQLite")
    if not args.sqlite_only:
        table += _postgresql(data)
    if args.write:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from benchmarks.results import write_section

        header = f"{HEADER}\n{RULE}\n"
        body = (
            f"{args.rows:,} stored requests, {args.workloads} workloads, one pair, 10 % holdout.\n\n"
            + header
            + "\n".join(table)
            + "\n\n"
            + SPLIT_NOTE
        )
        # 1M is the section every change reruns; another size keeps a section of its own beside it.
        size = "" if args.rows == 1_000_000 else f", {args.rows:,} requests"
        write_section(f"Drift run speed{size} (benchmarks/drift_speed.py)", body)


def _postgresql(data: dict[str, Any]) -> list[str]:
    name = f"dw_bench_{uuid.uuid4().hex[:10]}"
    admin = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        engine = create_engine(url)
        upgrade(engine)
        engine.dispose()
        t0 = time.perf_counter()
        load_postgresql(f"host=127.0.0.1 port=5432 user=postgres dbname={name}", data)
        print(f"(postgresql: loaded in {time.perf_counter() - t0:.1f} s)", flush=True)
        return time_runs(url, "PostgreSQL")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
