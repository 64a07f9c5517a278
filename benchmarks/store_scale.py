"""A store at production volume: 10 million requests (30 days, 50 workloads, 3 pairs) in PostgreSQL, measured.

    .venv/bin/python benchmarks/store_scale.py                          # 10,000,000 requests, writes RESULTS.md
    .venv/bin/python benchmarks/store_scale.py --rows 1000000 --no-write
    .venv/bin/python benchmarks/store_scale.py --generate-only          # build (or check) the cached database
    .venv/bin/python benchmarks/store_scale.py --drop                   # drop the cached database and exit

Generation. The requests are generated with numpy (the distributions of monitor/ingest/synthetic.py:
4-24 verification steps of γ = 4 drafts, each draft accepted with the workload's probability until
the first rejection, 8 or 11 ms per token × U(0.8, 1.25), TTFT U(20, 80) ms, prompts of 16-512
tokens), evenly over the last ``--days`` days, the workloads drawn with Zipf-like shares (the
largest about 10 % of traffic, the smallest 0.5 %), each on one of three target/drafter pairs (every
tenth workload split between two, an A/B test), 5 % holdout. They go in with COPY, in chunks of
whole minutes; each chunk's per-minute rollups (``rollup_minute`` and ``rollup_bins``) are
aggregated in numpy from the same arrays and copied too, so that they equal what the store's writer
would have made from the rows (a check recomputes a sample of rollup keys with
monitor/store/rollups.py from the stored rows). The tables' secondary indexes are dropped during
the load and rebuilt afterwards, then VACUUM ANALYZE. The database (``--db``, default
``draftwatch_scale_<records>``, on ``--pg``) is kept and reused by later runs when it holds the same
records and was generated less than ``--max-age`` hours ago (the dashboard reads "the last 24 hours"
by the wall clock); otherwise it is dropped and generated again.

Measurements, each bounded (a page render times out after 120 s, the writer runs for a fixed time):

* the drift run (monitor/drift/run.py ``run_drift``, default settings, at the end of the data), cold and warm;
* every dashboard page through Streamlit's AppTest (benchmarks/dashboard_speed.py's ``render_times``),
  cold caches, the default range (last 24 hours) and the last 7 days;
* ``GET /v1/workloads`` (the last hour, 24 hours and 7 days) and ``GET /metrics`` through the real
  app served by uvicorn on loopback; plus the database read behind ``/metrics`` on its own;
* the retention job (monitor/scheduler/retention.py ``apply_retention``, ``requests_days`` one less than
  the data's days, so it removes the oldest day) while a writer commits batches of 100 records
  through the store's own ``write_batch`` every 50 ms: the longest batch commit during the job is the
  longest stall of ingest (target: under the recorder's flush interval, ``recorder.flush_interval_s``,
  0.2 s: a record then waits no longer than it would for its batch anyway), and the records/s the
  writer commits during the job against before it. On a partitioned ``requests`` (docs/postgresql.md) it
  runs three times (``RETENTION_WAYS``): deleting the oldest day row by row as before partitioning
  (``by_partition=False``), dropping its partitions (both up to the next midnight, the same rows),
  and with ``retention.requests_edge`` delete at a cutoff inside a day (drops, then deletes the rest
  of the day: what retention exact to the minute costs); each with its seconds, the WAL it wrote
  (``pg_current_wal_lsn()`` before and after, the writer's few rows included) and the table's size
  afterwards. After each the day
  is copied back and the writer's rows removed, so the cached database stays as generated.

The database is migrated as a new installation is, so ``requests`` is partitioned by day
(migration 0014) and the rollups by week (0016), and the data's days and weeks get their partitions
before the load; a database cached before partitioning keeps its plain tables (``draftwatch db
partition`` converts them). The retention job keeps the rollups (``retention.rollups_days``, 400,
is past the data): dropping a week of them would take its restore a week of rollups to copy back.

Targets (issue 23): every page under 2 s at 1M requests and under 5 s at 10M; a drift run at most
10 s at 10M; no lock stalling ingest for more than a second (issue 40: no longer than one flush interval).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import psycopg

from benchmarks.generated_rows import GENERATED_COLUMNS
from decoder.record import OUTPUT_SPAN_EDGES
from monitor.ingest.settings import RecorderSettings
from monitor.store.lengths import PROMPT_EDGES

TITLE = "Store at production volume, {records:,} requests (benchmarks/store_scale.py)"  # one section per size
ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
PROTECTED = frozenset({"postgres", "test", "template0", "template1"})
PAIRS = (  # target, drafter, draft model
    ("qwen-coder-1.5b", "model", "qwen-coder-0.5b"),
    ("qwen-coder-1.5b", "ngram", None),
    ("llama-3.1-8b", "model", "llama-3.2-1b"),
)
# Holdout requests decode plain (drafter "none"), under the key of their target: codes 3 and 4.
KEYS = (*PAIRS, ("qwen-coder-1.5b", "none", None), ("llama-3.1-8b", "none", None))
GAMMA = 4
HOLDOUT_SHARE = 0.05
CHUNK_ROWS = 200_000
REQUEST_COLUMNS = GENERATED_COLUMNS
MINUTE_KEY = ("bucket", "workload", "target_model", "drafter", "draft_model", "mode")
# monitor.store.bins' metrics in the order the codes below use.
BIN_METRICS = (
    "ms_per_token",
    "ttft_ms",
    "accepted_at_position",
    "acceptance_length",
    "prompt_drafting",
    "prompt_drafted",
    "prompt_accepted",
    "span_drafting",
    "span_drafted",
    "span_accepted",
)
BATCH_SIZE = 1000  # records per recorder_batches marker, the recorder's default batch
BATCH_COLUMNS = ("batch_id", "origin", "n_records", "committed_at", "host", "pid")
GENERATOR_HOST = "scale-generator"  # the markers' host
NUM_BINS = 241  # monitor.store.bins.NUM_BINS
WRITER_WORKLOAD = "scale-writer"
PAGE_TARGETS = {1_000_000: 2.0, 10_000_000: 5.0}
DRIFT_TARGET_S = 10.0
STALL_TARGET_S = RecorderSettings(spool_dir=Path()).flush_interval_s  # the default: no batch held longer
WRITER_PERIOD_S = 0.05


# ---------------------------------------------------------------------------------------------- generation


@dataclass(frozen=True, slots=True)
class Plan:
    """What to generate: ``records`` requests over ``days`` days ending at ``anchor``, in minute-aligned chunks."""

    records: int
    days: int
    workloads: int
    seed: int
    anchor: datetime

    @property
    def start_us(self) -> int:
        return int((self.anchor - timedelta(days=self.days)).timestamp() * 1_000_000)

    @property
    def cutoff(self) -> datetime:
        """The retention cutoff when a day is one past ``requests_days`` (days - 1): a day after the first request."""
        return self.anchor - timedelta(days=self.days - 1)

    @property
    def day_cutoff(self) -> datetime:
        """The first midnight (UTC) at or after :attr:`cutoff`: a partition boundary, as a daily job's cutoff is."""
        midnight = self.cutoff.replace(hour=0, minute=0, second=0, microsecond=0)
        return midnight if midnight == self.cutoff else midnight + timedelta(days=1)

    @property
    def spacing_us(self) -> float:
        return self.days * 86_400e6 / self.records

    def offsets_us(self, first: int, stop: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Start times of requests ``first..stop-1``, in microseconds after the first minute."""
        return ((np.arange(first, stop, dtype=np.float64) + 0.5) * self.spacing_us).astype(np.int64)

    def chunks(self) -> list[tuple[int, int]]:
        """Index ranges holding whole minutes, about CHUNK_ROWS requests each."""
        per_minute = self.records / (self.days * 1440)
        minutes = max(1, round(CHUNK_ROWS / per_minute))
        minute_of = self.offsets_us(0, self.records) // 60_000_000
        edges = np.searchsorted(minute_of, np.arange(0, self.days * 1440 + minutes, minutes)).tolist()
        bounds = sorted({0, *[int(e) for e in edges], self.records})
        return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]

    def shares(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        weights = 1.0 / np.arange(1, self.workloads + 1) ** 0.8
        return np.asarray(weights / weights.sum())

    def alphas(self) -> np.ndarray[Any, np.dtype[np.float64]]:
        return np.random.default_rng(self.seed).uniform(0.3, 0.85, self.workloads)


def workload_name(index: int) -> str:
    return f"wl{index:02d}"


def generate_chunk(plan: Plan, number: int, first: int, stop: int) -> dict[str, Any]:
    """Column arrays of requests ``first..stop-1`` (deterministic per chunk, so a chunk can be made again)."""
    rng = np.random.default_rng([plan.seed, number])
    n = stop - first
    w = rng.choice(plan.workloads, n, p=plan.shares())
    base = w % 3
    split = (w % 10 == 4) & (rng.random(n) < 0.5)
    pair = np.where(split, (base + 1) % 3, base)
    hold = rng.random(n) < HOLDOUT_SHARE
    key = np.where(hold, np.where(pair == 2, 4, 3), pair)
    steps = rng.integers(4, 25, n)
    alpha = plan.alphas()[w] * np.where(pair == 1, 0.85, 1.0)
    powers = alpha[:, None] ** np.arange(GAMMA + 1)
    probs = np.concatenate([powers[:, :GAMMA] * (1 - alpha[:, None]), powers[:, GAMMA:]], axis=1)
    hist = rng.multinomial(steps, probs)
    hist[hold] = 0
    per_position = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1][:, 1:]
    accepted = hist @ np.arange(GAMMA + 1)
    spec_steps = np.where(hold, 0, steps)
    plain_output = 1 + rng.integers(8, 65, n)
    output = np.where(hold, plain_output, 1 + accepted + steps)
    ms_per_token = np.where(hold, 11.0, 8.0) * rng.uniform(0.8, 1.25, n)
    ttft = rng.uniform(20.0, 80.0, n)
    latency = ttft + ms_per_token * (output - 1)
    ts = plan.start_us + plan.offsets_us(first, stop)
    drafted_by_span, accepted_by_span = _spans(spec_steps, accepted)
    return {
        "index": np.arange(first, stop),
        "w": w,
        "key": key,
        "hold": hold,
        "hist": hist,
        "per_position": per_position,
        "accepted": accepted,
        "steps": spec_steps,
        "drafted": spec_steps * GAMMA,
        "drafted_by_span": drafted_by_span,
        "accepted_by_span": accepted_by_span,
        "output": output,
        "prompt": rng.integers(16, 513, n),
        "ttft": ttft,
        "latency": latency,
        "ts": ts,
        "ts_end": ts + np.round(latency * 1000).astype(np.int64),
    }


def _spans(
    steps: np.ndarray[Any, Any], accepted: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Drafted and accepted tokens by output span (decoder/record.py), as the embedded decoder counts them.

    The histogram does not say the order of the steps; each is taken to emit the request's mean
    ``1 + accepted / steps`` tokens, so step ``i`` starts at output position ``1 + i * emitted``. A span's
    steps draft GAMMA each, and its accepted tokens are the request's shared by cumulative floor, which
    keeps every span's accepted at most its drafted and the sums exact. Holdout requests: zeros.
    """
    per_step = 1.0 + accepted / np.maximum(steps, 1)
    edges = np.asarray(OUTPUT_SPAN_EDGES, dtype=np.float64)
    before = np.ceil((edges[None, :] - 1.0) / per_step[:, None]).astype(np.int64)  # steps starting before an edge
    cum_steps = np.concatenate([np.minimum(before, steps[:, None]), steps[:, None]], axis=1)
    cum_accepted = accepted[:, None] * cum_steps // np.maximum(steps, 1)[:, None]
    first = np.zeros((len(steps), 1), dtype=np.int64)
    return np.diff(cum_steps, axis=1, prepend=first) * GAMMA, np.diff(cum_accepted, axis=1, prepend=first)


def _strings(values: np.ndarray[Any, Any]) -> list[str]:
    # numpy writes floats in their shortest round-trip form, as repr() does: the stored value is the array's.
    return list(values.astype(str).tolist())


def _times(us: np.ndarray[Any, Any]) -> list[str]:
    return list(np.datetime_as_string(us.astype("datetime64[us]"), unit="us").tolist())  # UTC session


def request_lines(plan: Plan, data: dict[str, Any], mask: np.ndarray[Any, Any] | None = None) -> str:
    """COPY text of the chunk's requests, in REQUEST_COLUMNS order (``mask`` picks some)."""
    if mask is not None:
        data = {k: v[mask] for k, v in data.items()}
    n = len(data["index"])
    if n == 0:
        return ""
    hold = data["hold"].tolist()
    key = data["key"].tolist()
    names = [workload_name(i) for i in range(plan.workloads)]
    pp = [_strings(data["per_position"][:, i]) for i in range(GAMMA)]
    hh = [_strings(data["hist"][:, j]) for j in range(GAMMA + 1)]
    per_position = ["[]" if h else f"[{a},{b},{c},{d}]" for h, a, b, c, d in zip(hold, *pp, strict=True)]
    histogram = ["[]" if h else f"[{a},{b},{c},{d},{e}]" for h, a, b, c, d, e in zip(hold, *hh, strict=True)]
    spans = [
        ["[" + ",".join(counts) + "]" for counts in zip(*(_strings(data[name][:, k]) for k in range(3)), strict=True)]
        for name in ("drafted_by_span", "accepted_by_span")
    ]
    latency = data["latency"]
    ts_end = _times(data["ts_end"])
    columns: list[Any] = [
        [f"scale-{i}" for i in data["index"].tolist()],
        _times(data["ts"]),
        ts_end,
        [names[i] for i in data["w"].tolist()],
        [KEYS[k][0] for k in key],
        [KEYS[k][1] for k in key],
        [KEYS[k][2] or "\\N" for k in key],
        itertools.repeat("v1"),
        ["\\N" if h else "v1" for h in hold],
        ["holdout" if h else "speculative" for h in hold],
        ["0" if h else str(GAMMA) for h in hold],
        _strings(data["prompt"]),
        _strings(data["output"]),
        _strings(data["steps"]),
        _strings(data["drafted"]),
        _strings(data["accepted"]),
        per_position,
        histogram,
        _strings(data["ttft"]),
        _strings(latency),
        _strings(np.where(data["hold"], 0.0, latency * 0.2)),
        _strings(np.where(data["hold"], 0.0, latency * 0.7)),
        itertools.repeat("0.0"),
        itertools.repeat("1.0"),
        itertools.repeat("stop"),
        itertools.repeat("embedded"),
        itertools.repeat("f"),
        *spans,
        ts_end,  # ingested when it finished
    ]
    return "".join("\t".join(row) + "\n" for row in zip(*columns, strict=False))


def _value_bins(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """monitor.store.bins.value_bin, vectorised."""
    with np.errstate(divide="ignore"):
        index = 1 + np.floor(8 * np.log2(np.maximum(values, 1e-300) / 0.01))
    return np.where(values < 0.01, 0, np.clip(index, 1, NUM_BINS - 1)).astype(np.int64)


def rollup_lines(plan: Plan, data: dict[str, Any]) -> tuple[str, str]:
    """COPY text of the chunk's ``rollup_minute`` and ``rollup_bins`` rows (the chunk holds whole minutes)."""
    minute = (data["ts"] // 60_000_000).astype(np.int64)
    code = (minute * plan.workloads + data["w"]) * len(KEYS) + data["key"]
    keys, inv = np.unique(code, return_inverse=True)
    m = len(keys)

    def total(weights: Any = None) -> np.ndarray[Any, Any]:
        return np.bincount(inv, weights=weights, minlength=m)

    drafted, accepted, output = data["drafted"], data["accepted"], data["output"]
    latency, ttft = data["latency"], data["ttft"]
    rate = np.where(drafted > 0, accepted / np.maximum(drafted, 1), 0.0)
    decode = np.maximum(latency - ttft, 0.0) / (output - 1)  # every generated request has >= 2 output tokens
    ints = [
        total(),
        np.zeros(m),
        total(data["prompt"]),
        total(output),
        total(data["steps"]),
        total(drafted),
        total(accepted),
        total(drafted > 0),
    ]
    sums: list[list[str]] = [_strings(np.rint(x).astype(np.int64)) for x in ints]
    sums += [_strings(total(rate)), _strings(total()), _strings(total(decode)), _strings(total(latency))]
    sums += [_strings(np.rint(total(output)).astype(np.int64)), _strings(total()), _strings(total(ttft))]
    k_minute, rest = np.divmod(keys, plan.workloads * len(KEYS))
    k_w, k_key = np.divmod(rest, len(KEYS))
    bucket = _times(k_minute * 60_000_000)
    names = [workload_name(i) for i in k_w.tolist()]
    heads = [
        (b, wl, KEYS[k][0], KEYS[k][1], KEYS[k][2] or "", "holdout" if k >= 3 else "speculative")
        for b, wl, k in zip(bucket, names, k_key.tolist(), strict=True)
    ]
    minutes = "".join(
        "\t".join(head) + "\t" + "\t".join(values) + "\n" for head, *values in zip(heads, *sums, strict=True)
    )

    # Bins: (key, metric, bin) with the count each request adds; only non-zero counts, as the writer stores.
    nm = len(BIN_METRICS)
    parts = [
        (inv * nm + 0) * NUM_BINS + _value_bins(decode),
        (inv * nm + 1) * NUM_BINS + _value_bins(ttft),
    ]
    weights = [np.ones(len(inv)), np.ones(len(inv))]
    for i in range(GAMMA):
        parts.append((inv * nm + 2) * NUM_BINS + i)
        weights.append(data["per_position"][:, i].astype(np.float64))
    for j in range(GAMMA + 1):
        parts.append((inv * nm + 3) * NUM_BINS + j)
        weights.append(data["hist"][:, j].astype(np.float64))
    present = [w > 0 for w in weights]  # the writer adds these only where the count is not 0
    # Acceptance by prompt length (monitor.store.lengths.prompt_bucket), over requests that drafted.
    bucket = np.searchsorted(np.asarray(PROMPT_EDGES), data["prompt"], side="right")
    drafting = drafted > 0
    for m, values in ((4, np.ones(len(inv))), (5, drafted), (6, accepted)):
        parts.append((inv * nm + m) * NUM_BINS + bucket)
        weights.append(np.where(drafting, values, 0).astype(np.float64))
        present.append(drafting)  # ... these for every request that drafted, a 0 included
    # Acceptance by output span, over the spans a request drafted in.
    for k in range(len(OUTPUT_SPAN_EDGES) + 1):
        span_drafted = data["drafted_by_span"][:, k]
        for m, values in ((7, np.ones(len(inv))), (8, span_drafted), (9, data["accepted_by_span"][:, k])):
            parts.append((inv * nm + m) * NUM_BINS + k)
            weights.append(np.where(span_drafted > 0, values, 0).astype(np.float64))
            present.append(span_drafted > 0)
    all_codes, all_weights = np.concatenate(parts), np.concatenate(weights)
    bin_codes, bin_inv = np.unique(all_codes, return_inverse=True)
    counts = np.rint(np.bincount(bin_inv, weights=all_weights)).astype(np.int64)
    keep = np.bincount(bin_inv, weights=np.concatenate(present).astype(np.float64)) > 0
    bin_codes, counts = bin_codes[keep], counts[keep]
    rest, index = np.divmod(bin_codes, NUM_BINS)
    owner, metric = np.divmod(rest, nm)
    bins = "".join(
        "\t".join(heads[o]) + f"\t{BIN_METRICS[mt]}\t{b}\t{c}\n"
        for o, mt, b, c in zip(owner.tolist(), metric.tolist(), index.tolist(), counts.tolist(), strict=True)
    )
    return minutes, bins


def batch_lines(data: dict[str, Any]) -> str:
    """COPY text of the ``recorder_batches`` markers the recorder would have committed with the chunk's requests:
    one per BATCH_SIZE requests in arrival order, committed when the last of them finished."""
    index, ts_end = data["index"], data["ts_end"]
    starts = np.arange(0, len(index), BATCH_SIZE)
    ends = np.minimum(starts + BATCH_SIZE, len(index))
    committed = np.maximum.reduceat(ts_end, starts) if len(index) else ts_end[:0]
    return "".join(
        f"scale-{index[a]}\tlive\t{b - a}\t{at}\t{GENERATOR_HOST}\t\\N\n"
        for a, b, at in zip(starts.tolist(), ends.tolist(), _times(committed), strict=True)
    )


def chunk_text(plan: Plan, number: int, first: int, stop: int) -> tuple[int, str, str, str, str]:
    data = generate_chunk(plan, number, first, stop)
    minutes, bins = rollup_lines(plan, data)
    return stop - first, request_lines(plan, data), minutes, bins, batch_lines(data)


def _connect(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, **kwargs)
    conn.execute("SET TIME ZONE 'UTC'")
    return conn


def _secondary_indexes(conn: psycopg.Connection[Any], tables: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(table, name, how to make it again) for unique constraints and plain indexes, primary keys left out."""
    found: list[tuple[str, str, str]] = []
    for table in tables:
        constraints = conn.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass "
            "AND contype = 'u'",
            (table,),
        ).fetchall()
        for name, definition in constraints:
            found.append((table, name, f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}'))
        taken = {name for name, _ in constraints}
        for name, definition in conn.execute(
            "SELECT i.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "WHERE x.indrelid = %s::regclass AND NOT x.indisprimary",
            (table,),
        ).fetchall():
            if name not in taken:  # a partitioned table's index is made again on every partition
                found.append((table, name, definition.replace(" ON ONLY ", " ON ")))
    return found


def generate(plan: Plan, dsn: str) -> float:
    """Fill the (migrated, empty) database; returns the seconds it took."""
    t0 = time.perf_counter()
    chunks = plan.chunks()
    with _connect(dsn) as conn:
        conn.execute("SET maintenance_work_mem = '256MB'")
        indexes = _secondary_indexes(conn, ("requests", "rollup_minute", "rollup_bins"))
        for table, name, _ in indexes:
            if name.startswith("uq_"):
                conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
            else:
                conn.execute(f'DROP INDEX "{name}"')
        conn.commit()
        done = 0
        with ThreadPoolExecutor(1) as pool:  # the next chunk is made while this one is copied
            pending = pool.submit(chunk_text, plan, 0, *chunks[0])
            for number in range(len(chunks)):
                n, requests, minutes, bins, batches = pending.result()
                if number + 1 < len(chunks):
                    pending = pool.submit(chunk_text, plan, number + 1, *chunks[number + 1])
                with conn.cursor() as cur:
                    with cur.copy(f"COPY requests ({', '.join(REQUEST_COLUMNS)}) FROM STDIN") as copy:
                        copy.write(requests)
                    names = ", ".join((*MINUTE_KEY, *_sum_columns()))
                    with cur.copy(f"COPY rollup_minute ({names}) FROM STDIN") as copy:
                        copy.write(minutes)
                    with cur.copy(f"COPY rollup_bins ({', '.join(MINUTE_KEY)}, metric, bin, count) FROM STDIN") as copy:
                        copy.write(bins)
                    with cur.copy(f"COPY recorder_batches ({', '.join(BATCH_COLUMNS)}) FROM STDIN") as copy:
                        copy.write(batches)
                conn.commit()
                done += n
                elapsed = time.perf_counter() - t0
                eta = elapsed / done * (plan.records - done)
                print(
                    f"  {done:>12,} / {plan.records:,} requests ({done / plan.records:4.0%}), {elapsed:5.0f} s, "
                    f"{done / elapsed:,.0f}/s, about {eta:.0f} s to go",
                    flush=True,
                )
        _versions(conn, plan)
        print(f"  rebuilding {len(indexes)} indexes and constraints", flush=True)
        for _table, name, definition in indexes:
            t1 = time.perf_counter()
            conn.execute(definition)
            conn.commit()
            print(f"    {name}: {time.perf_counter() - t1:.0f} s", flush=True)
    _name_partition_indexes(dsn)
    with _connect(dsn, autocommit=True) as conn:
        print("  VACUUM ANALYZE", flush=True)
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - t0


def _name_partition_indexes(dsn: str) -> None:
    """The partitions' indexes rebuilt above named as the store names them (ix_requests_ts_p20261203)."""
    from monitor.store.engine import create_engine
    from monitor.store.partitions import TABLES, is_partitioned, list_partitions, name_partition_indexes

    engine = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:5432/{dsn.rsplit('dbname=', 1)[1]}")
    with engine.begin() as conn:
        for table in TABLES:
            if is_partitioned(conn, table.name):
                for partition in list_partitions(conn, table.name):
                    name_partition_indexes(conn, partition.name, table.name)
    engine.dispose()


def _layout(dsn: str) -> str:
    with _connect(dsn) as conn:
        kinds = dict(
            conn.execute(
                "SELECT relname, relkind FROM pg_class WHERE relname IN ('requests', 'rollup_minute', 'rollup_bins') "
                "AND relnamespace = 'public'::regnamespace"
            ).fetchall()
        )
    layout = "partitioned by day" if kinds.get("requests") == "p" else "one table, not partitioned"
    rollups = "by week" if kinds.get("rollup_bins") == "p" else "not partitioned"
    return f"{layout}, rollups {rollups}"


def _requests_size(dsn: str) -> int:
    """Bytes of requests with its indexes, its partitions' when partitioned."""
    with _connect(dsn) as conn:
        (size,) = conn.execute(
            "SELECT pg_total_relation_size('requests') + coalesce((SELECT sum(pg_total_relation_size(inhrelid)) "
            "FROM pg_inherits WHERE inhparent = 'requests'::regclass), 0)"
        ).fetchone() or (0,)
    return int(size)


def _partitions_for(url: str, plan: Plan) -> None:
    """The partitions of the plan's days, and the rollups' of its weeks (the store makes today's and ahead; these
    are the past's)."""
    from monitor.store.engine import create_engine
    from monitor.store.partitions import ensure_all_partitions

    engine = create_engine(url)
    ensure_all_partitions(engine, plan.anchor - timedelta(days=plan.days), plan.days + 1, partition_days=1)
    engine.dispose()


def _sum_columns() -> tuple[str, ...]:
    from monitor.store.rollups import SUM_COLUMNS

    return tuple(SUM_COLUMNS)


def _versions(conn: psycopg.Connection[Any], plan: Plan) -> None:
    """The model versions and first-seen events the writer records for the generated models."""
    first = plan.anchor - timedelta(days=plan.days)
    seen = sorted({("target", t) for t, _, _ in PAIRS} | {("draft", dm or d) for _, d, dm in PAIRS})
    for role, model in seen:
        (vid,) = conn.execute(
            "INSERT INTO model_versions (role, model, version, first_seen) VALUES (%s, %s, 'v1', %s) RETURNING id",
            (role, model, first),
        ).fetchone() or (None,)
        conn.execute(
            "INSERT INTO deployment_events (ts, kind, role, model, version, model_version_id, workload) "
            "VALUES (%s, 'first_seen', %s, %s, 'v1', %s, %s)",
            (first, role, model, vid, workload_name(0)),
        )
    conn.commit()


def check_rollups(url: str, samples: int = 40) -> int:
    """Recompute ``samples`` random rollup keys from their stored rows with the writer's own code; returns
    how many differ (0 expected)."""
    from sqlalchemy import text

    from monitor.store import rollups
    from monitor.store.engine import create_engine
    from monitor.store.models import RequestRow
    from monitor.store.writes.rows import from_row

    engine = create_engine(url)
    bad = 0
    with engine.connect() as conn:
        keys = conn.execute(
            text(
                "SELECT bucket, workload, target_model, drafter, draft_model, mode FROM rollup_minute "
                "TABLESAMPLE SYSTEM (1) REPEATABLE (7) LIMIT :n"
            ),
            {"n": samples},
        ).all()
        for bucket, workload, target, drafter, draft_model, mode in keys:
            rows = conn.execute(
                RequestRow.__table__.select().where(
                    RequestRow.ts_start >= bucket,
                    RequestRow.ts_start < bucket + timedelta(minutes=1),
                    RequestRow.workload == workload,
                    RequestRow.target_model == target,
                    RequestRow.drafter == drafter,
                    RequestRow.mode == mode,
                )
            ).all()
            delta = rollups.compute([from_row(r) for r in rows if (r.draft_model or "") == draft_model])
            want = {(tuple(d[c] for c in ("metric", "bin")), d["count"]) for d in delta.bins}
            have = {
                ((m, int(b)), int(c))
                for m, b, c in conn.execute(
                    text(
                        "SELECT metric, bin, count FROM rollup_bins WHERE bucket = :b AND workload = :w "
                        "AND target_model = :t AND drafter = :d AND draft_model = :dm AND mode = :m"
                    ),
                    {"b": bucket, "w": workload, "t": target, "d": drafter, "dm": draft_model, "m": mode},
                )
            }
            stored = conn.execute(
                text(
                    f"SELECT {', '.join(rollups.SUM_COLUMNS)} FROM rollup_minute WHERE bucket = :b AND workload = :w "
                    "AND target_model = :t AND drafter = :d AND draft_model = :dm AND mode = :m"
                ),
                {"b": bucket, "w": workload, "t": target, "d": drafter, "dm": draft_model, "m": mode},
            ).one()
            expected = delta.minutes[0] if delta.minutes else {}
            same = all(
                abs(float(stored[i]) - float(expected.get(c, 0))) <= 1e-9 * max(1.0, abs(float(stored[i])))
                for i, c in enumerate(rollups.SUM_COLUMNS)
            )
            if not same or want != have:
                bad += 1
    engine.dispose()
    return bad


# ---------------------------------------------------------------------------------------------- the cache


def _exists(name: str) -> bool:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def _drop(name: str) -> None:
    if name in PROTECTED:
        raise SystemExit(f"refusing to drop {name}")
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _cached_plan(dsn: str, records: int, days: int, workloads: int, max_age: timedelta) -> Plan | None:
    """The plan of the database as generated earlier, if it is whole, the same shape and recent enough."""
    try:
        with _connect(dsn) as conn:
            row = conn.execute("SELECT records, days, workloads, seed, anchor FROM dw_scale_meta").fetchone()
            if row is None:
                return None
            plan = Plan(int(row[0]), int(row[1]), int(row[2]), int(row[3]), row[4])
            if (plan.records, plan.days, plan.workloads) != (records, days, workloads):
                print(f"  cached database holds {plan.records:,} requests / {plan.days} days / {plan.workloads}")
                return None
            if datetime.now(UTC) - plan.anchor > max_age:
                print(f"  cached database was generated at {plan.anchor:%Y-%m-%d %H:%M} UTC, older than the limit")
                return None
            (count,) = conn.execute("SELECT count(*) FROM requests").fetchone() or (0,)
            if count != records:
                print(f"  cached database holds {count:,} requests, not {records:,}")
                return None
            (markers,) = conn.execute(
                "SELECT count(*) FROM recorder_batches WHERE host = %s", (GENERATOR_HOST,)
            ).fetchone() or (0,)
            if not markers:  # an earlier generator's: no batch markers, no span counts
                print("  cached database was made by an earlier generator (no recorder_batches markers)")
                return None
            return plan
    except psycopg.Error as error:
        print(f"  no usable cached database ({type(error).__name__})")
        return None


def prepare(name: str, records: int, days: int, workloads: int, seed: int, max_age: timedelta) -> tuple[Plan, float]:
    """The database ``name`` holding the plan's requests: reused, or (re)generated. Returns the plan and the
    seconds generation took (0 when reused)."""
    from monitor.store.engine import create_engine
    from monitor.store.migrate import upgrade

    if name in PROTECTED:
        raise SystemExit(f"{name} is not a benchmark database")
    dsn = f"host=127.0.0.1 port=5432 user=postgres dbname={name}"
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    if _exists(name):
        plan = _cached_plan(dsn, records, days, workloads, max_age)
        if plan is not None:
            engine = create_engine(url)
            upgrade(engine)  # a migration that landed since adds its columns
            engine.dispose()
            print(f"reusing {name}: {records:,} requests ending {plan.anchor:%Y-%m-%d %H:%M} UTC", flush=True)
            return plan, 0.0
        _drop(name)
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = create_engine(url)
    upgrade(engine)
    engine.dispose()
    anchor = datetime.now(UTC).replace(second=0, microsecond=0)
    plan = Plan(records, days, workloads, seed, anchor)
    _partitions_for(url, plan)
    print(f"generating {records:,} requests over {days} days into {name} (chunks of whole minutes)", flush=True)
    seconds = generate(plan, dsn)
    with _connect(dsn) as conn:
        conn.execute(
            "CREATE TABLE dw_scale_meta (records bigint, days int, workloads int, seed int, anchor timestamptz, "
            "generated_s float8)"
        )
        conn.execute(
            "INSERT INTO dw_scale_meta VALUES (%s, %s, %s, %s, %s, %s)",
            (records, days, workloads, seed, anchor, seconds),
        )
    print(f"generated in {seconds:.0f} s", flush=True)
    return plan, seconds


def database_size(dsn: str) -> str:
    with _connect(dsn) as conn:
        (size,) = conn.execute("SELECT pg_size_pretty(pg_database_size(current_database()))").fetchone() or ("?",)
        return str(size)


# ---------------------------------------------------------------------------------------------- measurements


def measure_drift(url: str, plan: Plan) -> list[tuple[str, float, float, int]]:
    """(label, wall s, CPU s of this process, results) of a cold and a warm run with the default settings."""
    from monitor.drift.run import run_drift
    from monitor.drift.settings import DriftSettings
    from monitor.store.engine import create_engine

    engine = create_engine(url)
    out = []
    for label in ("cold", "warm"):
        t0, cpu0 = time.perf_counter(), time.process_time()
        run = run_drift(engine, DriftSettings(), plan.anchor)
        out.append((label, time.perf_counter() - t0, time.process_time() - cpu0, len(run.results)))
        print(f"  drift run ({label}): {out[-1][1]:.2f} s, {out[-1][2]:.2f} s CPU, {out[-1][3]} results", flush=True)
    engine.dispose()
    return out


@contextlib.contextmanager
def serving(url: str) -> Iterator[str]:
    """The sidecar app on a loopback port (uvicorn in a thread); yields its base URL."""
    import uvicorn

    from monitor.api.app import create_app
    from monitor.config import Settings

    data_dir = tempfile.mkdtemp(prefix="dw-scale-")
    settings = Settings.from_env({"DRAFTWATCH_DATABASE_URL": url, "DRAFTWATCH_DATA_DIR": data_dir})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the sidecar did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def measure_api(url: str, plan: Plan, repeats: int) -> list[tuple[str, list[float]]]:
    """Seconds per GET, ``repeats`` times each, through the real app; plus the read behind /metrics."""
    import httpx

    from monitor.api.reads.metrics import read_figures
    from monitor.config import Settings
    from monitor.store.engine import create_engine

    end = plan.anchor + timedelta(minutes=1)
    results: list[tuple[str, list[float]]] = []
    with serving(url) as base, httpx.Client(base_url=base, timeout=120) as client:
        for label, span in (("last hour (the default span)", timedelta(hours=1)), ("24 hours", timedelta(days=1)),
                            ("7 days", timedelta(days=7))):  # fmt: skip
            params = {"since": (end - span).isoformat(), "until": end.isoformat()}
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                response = client.get("/v1/workloads", params=params)
                times.append(time.perf_counter() - t0)
                response.raise_for_status()
            n = len(response.json()["workloads"])
            results.append((f"GET /v1/workloads, {label}: {n} workloads", times))
            print(f"  {results[-1][0]}: {statistics.median(times):.3f} s", flush=True)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            client.get("/metrics").raise_for_status()
            times.append(time.perf_counter() - t0)
            time.sleep(5.1)  # past the figures' MAX_AGE_S, so that each scrape starts a read
        results.append(("GET /metrics (waits at most 0.25 s for the database's figures)", times))
        print(f"  {results[-1][0]}: {statistics.median(times):.3f} s", flush=True)
    engine = create_engine(url)
    settings = Settings.from_env({"DRAFTWATCH_DATABASE_URL": url})
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        read_figures(engine, settings)
        times.append(time.perf_counter() - t0)
    engine.dispose()
    results.append(("the database read behind /metrics (read_figures)", times))
    print(f"  {results[-1][0]}: {statistics.median(times):.3f} s", flush=True)
    return results


@dataclass(frozen=True, slots=True)
class RetentionFigures:
    how: str  # "delete" (row by row, batched) or "drop" (the partition)
    seconds: float
    deleted: dict[str, int]
    batches_before: list[float]
    batches_during: list[float]
    batches_after: list[float]
    longest_gap_s: float
    wal_bytes: int
    size_after: int
    writer_s: float

    def rate(self, batches: list[float], seconds: float | None = None) -> float:
        """Records/s the writer committed over ``seconds`` (default: the writer's time before the job)."""
        span = self.writer_s if seconds is None else seconds
        return len(batches) * 100 / span if span > 0 else 0.0


RETENTION_WAYS = {  # how: (by_partition, requests_edge, cutoff at a partition boundary)
    "delete": (False, "delete", True),
    "drop": (True, "keep", True),
    "exact": (True, "delete", False),
}


def measure_retention(url: str, dsn: str, plan: Plan, writer_s: float, how: str = "drop") -> RetentionFigures:
    """The retention job removing the oldest day while a writer commits a batch every 50 ms; then restore.

    ``how``: ``delete`` row by row and ``drop`` (partitions, the default ``retention.requests_edge``
    keep) to the first midnight after the oldest day, so both remove the same rows; ``exact`` drops
    what it can and deletes the rest of the day up to a cutoff inside a partition
    (``requests_edge`` delete), what a daily job pays for retention exact to the minute."""
    from monitor.ingest.synthetic import synthetic_record
    from monitor.scheduler.retention import apply_retention
    from monitor.scheduler.settings import RetentionSettings
    from monitor.store.engine import create_engine
    from monitor.store.writes.writer import write_batch

    engine = create_engine(url)
    commits: list[tuple[float, float]] = []  # (start, seconds)
    stop = threading.Event()
    failures: list[BaseException] = []

    def writer() -> None:
        number = 0
        origin = datetime.now(UTC)
        try:
            while not stop.is_set():
                batch = [
                    synthetic_record(
                        number * 100 + i, workload=WRITER_WORKLOAD, start=origin, spacing=timedelta(milliseconds=1),
                        prefix=WRITER_WORKLOAD,
                    )
                    for i in range(100)
                ]  # fmt: skip
                t0 = time.perf_counter()
                with engine.begin() as conn:
                    write_batch(conn, batch, f"{WRITER_WORKLOAD}-{number}", "live")
                commits.append((t0, time.perf_counter() - t0))
                number += 1
                stop.wait(max(0.0, WRITER_PERIOD_S - (time.perf_counter() - t0)))
        except BaseException as error:  # reported by the caller
            failures.append(error)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    time.sleep(writer_s)
    by_partition, edge, at_boundary = RETENTION_WAYS[how]
    settings = RetentionSettings(requests_days=plan.days - 1, requests_edge=edge)
    now = (plan.day_cutoff if at_boundary else plan.cutoff) + timedelta(days=plan.days - 1)
    with _connect(dsn, autocommit=True) as conn:
        (lsn_start,) = conn.execute("SELECT pg_current_wal_lsn()").fetchone() or ("0/0",)
        t_start = time.perf_counter()
        deleted = apply_retention(engine, settings, now, by_partition=by_partition)
        t_end = time.perf_counter()
        (wal,) = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn_start,)).fetchone() or (0,)
    time.sleep(writer_s)
    stop.set()
    thread.join(30)
    engine.dispose()
    if failures:
        raise RuntimeError(f"the writer failed: {failures[0]!r}")
    before = [s for t, s in commits if t + s < t_start]
    during = [s for t, s in commits if t + s >= t_start and t < t_end]
    after = [s for t, s in commits if t >= t_end]
    # A stall also shows as a gap between one commit's end and the next one's: the writer waits 50 ms.
    ends = sorted(t + s for t, s in commits)
    gaps = [b - a for a, b in itertools.pairwise(ends) if b >= t_start and a <= t_end]
    figures = RetentionFigures(how, t_end - t_start, deleted, before, during, after, max(gaps, default=0.0),
                               int(wal), _requests_size(dsn), writer_s)  # fmt: skip
    print(
        f"  retention ({how}): {figures.seconds:.2f} s, {_removed(deleted):,} requests, {figures.wal_bytes:,} bytes "
        f"of WAL; writer batches during it: {len(during)}, longest {max(during, default=0):.3f} s; longest gap "
        f"between commits {figures.longest_gap_s:.3f} s; requests now {figures.size_after:,} bytes",
        flush=True,
    )
    restore(url, dsn, plan, now - timedelta(days=settings.requests_days))
    return figures


def _removed(deleted: dict[str, int]) -> int:
    return deleted.get("requests", 0) + deleted.get("requests_rows_dropped_estimate", 0)


def restore(url: str, dsn: str, plan: Plan, cutoff: datetime) -> None:
    """Put back the requests before ``cutoff`` the retention job removed and remove the writer's rows, so the
    cache stays as generated."""
    t0 = time.perf_counter()
    _partitions_for(url, plan)  # the dropped day's partition made again
    cut_us = int(cutoff.timestamp() * 1_000_000)
    with _connect(dsn) as conn:
        conn.execute("DELETE FROM requests WHERE workload = %s", (WRITER_WORKLOAD,))
        conn.execute("DELETE FROM rollup_minute WHERE workload = %s", (WRITER_WORKLOAD,))
        conn.execute("DELETE FROM rollup_bins WHERE workload = %s", (WRITER_WORKLOAD,))
        conn.execute("DELETE FROM recorder_batches WHERE batch_id LIKE %s", (f"{WRITER_WORKLOAD}-%",))
        (have,) = conn.execute("SELECT count(*) FROM requests").fetchone() or (0,)
        for number, (first, stop) in enumerate(plan.chunks()):
            if plan.start_us + plan.offsets_us(first, first + 1)[0] >= cut_us:
                break
            data = generate_chunk(plan, number, first, stop)
            with conn.cursor() as cur, cur.copy(f"COPY requests ({', '.join(REQUEST_COLUMNS)}) FROM STDIN") as copy:
                copy.write(request_lines(plan, data, data["ts"] < cut_us))
        conn.commit()
        (count,) = conn.execute("SELECT count(*) FROM requests").fetchone() or (0,)
    with _connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE requests")
    print(f"  restored {count - have:,} requests in {time.perf_counter() - t0:.0f} s (now {count:,})", flush=True)
    if count != plan.records:
        raise RuntimeError(f"restore left {count:,} requests, not {plan.records:,}")


# ---------------------------------------------------------------------------------------------- report


def _page_target(records: int) -> float:
    return PAGE_TARGETS.get(records, 2.0 if records <= 1_000_000 else 5.0)


def report(
    plan: Plan,
    generated_s: float,
    size: str,
    drift: list[tuple[str, float, float, int]],
    pages: dict[tuple[str, str], list[float]],
    api: list[tuple[str, list[float]]],
    retention: list[RetentionFigures],
    load: tuple[float, float],
    rollup_mismatches: int | None,
    layout: str = "one table, not partitioned",
) -> str:
    from benchmarks.dashboard_speed import PAGES, RANGES

    lines = [
        f"{plan.records:,} requests over {plan.days} days, {plan.workloads} workloads (Zipf-like shares), 3 pairs "
        f"(every tenth workload split between two), {HOLDOUT_SHARE:.0%} holdout, in PostgreSQL (database {size}, "
        f"requests {layout}); "
        f"rollups as the writer makes them"
        + ("" if rollup_mismatches is None else f" ({rollup_mismatches} of 40 sampled keys differ from rollups.py)")
        + "."
        + (
            f" Generating took {generated_s:.0f} s." if generated_s else " The database was reused from an earlier run."
        ),
        "",
        "| measurement | median s | max s | target |",
        "| --- | ---: | ---: | --- |",
    ]
    for label, wall, cpu, results in drift:
        target = f"≤ {DRIFT_TARGET_S:.0f} s" + (" (at 10M)" if plan.records < 10_000_000 else "")
        lines.append(f"| drift run, defaults, {label} ({cpu:.1f} s CPU here, {results} results) | {wall:.2f} | "
                     f"{wall:.2f} | {target} |")  # fmt: skip
    page_target = _page_target(plan.records)
    for range_name in RANGES:
        for page in PAGES:
            times = pages.get((range_name, page))
            if times:
                lines.append(
                    f"| dashboard {page}, {range_name} | {statistics.median(times):.2f} | {max(times):.2f} | "
                    f"< {page_target:.0f} s |"
                )
    for label, times in api:
        lines.append(f"| {label} | {statistics.median(times):.3f} | {max(times):.3f} | |")
    for r in retention:
        verb = {
            "delete": "deleting the oldest day row by row",
            "drop": "dropping the oldest day's partitions",
            "exact": "dropping what it can, deleting the rest of a day (requests_edge delete)",
        }[r.how]
        lines.append(
            f"| retention job {verb} ({_removed(r.deleted):,} requests; {r.wal_bytes / 2**20:,.1f} MiB of WAL; "
            f"requests {r.size_after / 2**20:,.0f} MiB after) | {r.seconds:.2f} | {r.seconds:.2f} | |"
        )
        for label, batch in (("before", r.batches_before), ("during", r.batches_during), ("after", r.batches_after)):
            if batch:
                lines.append(f"| a writer's batch of 100 records, {label} the job ({r.how}, {len(batch)} batches) | "
                             f"{statistics.median(batch):.3f} | {max(batch):.3f} | "
                             + (f"< {STALL_TARGET_S:g} s |" if label == "during" else "|"))  # fmt: skip
        gap_target = WRITER_PERIOD_S + STALL_TARGET_S
        lines.append(
            f"| longest gap between two commits during the job ({r.how}; the writer's period is "
            f"{WRITER_PERIOD_S:g} s) | {r.longest_gap_s:.3f} | {r.longest_gap_s:.3f} | < {gap_target:g} s |"
        )
        lines.append(f"| the writer's records/s before the job / during it ({r.how}) | {r.rate(r.batches_before):,.0f}"
                     f" | {r.rate(r.batches_during, r.seconds):,.0f} | |")  # fmt: skip
    lines += [
        "",
        "Dashboard figures are cold renders (every Streamlit cache cleared) of the whole page through AppTest; "
        "the API's through uvicorn on loopback with httpx. The drift run ends at the data's last minute. The writer "
        "commits through the store's own write_batch (what the recorder does), a batch every 50 ms.",
        "",
        f"Load average (1 min) at start / end: {load[0]:.1f} / {load[1]:.1f}; PostgreSQL (default settings: "
        "shared_buffers 128 MB, work_mem 4 MB) shares the machine with the benchmark.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--records", "--rows", type=int, default=10_000_000, help="requests to generate (default 10,000,000)"
    )
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--workloads", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--db", default=None, help="database name (default draftwatch_scale_<records>)")
    parser.add_argument("--max-age", type=float, default=6.0, help="hours a cached database stays usable (default 6)")
    parser.add_argument("--repeats", type=int, default=3, help="renders / requests per figure (default 3)")
    parser.add_argument("--writer-seconds", type=float, default=5.0, help="writer time before and after retention")
    parser.add_argument("--skip", action="append", default=[], choices=["drift", "dashboard", "api", "retention"])
    parser.add_argument("--generate-only", action="store_true", help="build or check the database, measure nothing")
    parser.add_argument("--drop", action="store_true", help="drop the database and exit")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("streamlit").setLevel(logging.ERROR)
    os.environ.setdefault("STREAMLIT_LOGGER_LEVEL", "error")  # AppTest's bare-mode warnings, once per render
    name = args.db or f"draftwatch_scale_{args.records}"
    if args.drop:
        _drop(name)
        print(f"dropped {name}")
        return 0
    load_start = os.getloadavg()[0]
    plan, generated_s = prepare(name, args.records, args.days, args.workloads, args.seed,
                                timedelta(hours=args.max_age))  # fmt: skip
    dsn = f"host=127.0.0.1 port=5432 user=postgres dbname={name}"
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    size = database_size(dsn)
    print(f"database size: {size}", flush=True)
    mismatches = check_rollups(url) if generated_s else None
    if mismatches is not None:
        print(f"rollup check: {mismatches} of 40 sampled keys differ", flush=True)
    if args.generate_only:
        return 0 if not mismatches else 1
    drift = measure_drift(url, plan) if "drift" not in args.skip else []
    pages: dict[tuple[str, str], list[float]] = {}
    if "dashboard" not in args.skip:
        from benchmarks.dashboard_speed import render_times

        pages = render_times(url, args.repeats)
    api = measure_api(url, plan, args.repeats) if "api" not in args.skip else []
    layout = _layout(dsn)
    retention = []
    if "retention" not in args.skip:
        ways = tuple(RETENTION_WAYS) if layout.startswith("partitioned") else ("delete",)
        retention = [measure_retention(url, dsn, plan, args.writer_seconds, how) for how in ways]
    body = report(plan, generated_s, size, drift, pages, api, retention, (load_start, os.getloadavg()[0]), mismatches,
                  layout)  # fmt: skip
    print(body)
    if not args.no_write:
        from benchmarks.results import write_section

        write_section(
            TITLE.format(records=plan.records),
            body,
            ["benchmarks/store_scale.py", *(argv if argv is not None else sys.argv[1:])],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
