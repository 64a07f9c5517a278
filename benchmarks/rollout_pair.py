"""A drafter rollout on the Qwen pair (issue 39): a real candidate on real requests, judged by the product's judge.

    python -m benchmarks.rollout_pair [--requests 36] [--workloads extract,prose]
                                      [--candidate model:qwen-coder-0.5b] [--remeasure]
                                      [--interval-min M] [--runs 200] [--jobs 2] [--no-write]

1. **Measured.** The demo's decoder, as ``draftwatch serve --target qwen-coder-1.5b --draft
   qwen-coder-0.5b --drafter ngram --candidate-drafter CANDIDATE`` builds it (the portfolio of the
   0.5B draft model and the n-gram drafter under a controller whose pairs are timed at start, the
   candidate on an arm of its own), staged as a rollout's first step stages it: the candidate
   serves half of each workload's requests, drawn per request by the decoder itself. Requests one
   at a time, the workloads in turn and each workload's built-in prompts in turn, 32 new tokens as
   in the demo, temperature 0.7 with a seed per request so that a prompt's repeats differ as users'
   do, until each workload has ``--requests`` on each side. The default candidate,
   ``model:qwen-coder-0.5b``, is "the draft model alone": it drops the n-gram drafter, which on a
   CPU is what pays on copy-heavy prompts (benchmarks/RESULTS.md, "Drafter portfolio").
   The records are kept (JSON lines) in the cache (``benchmarks/`` under ``~/.cache/draftwatch``,
   one file per pair, candidate, workloads and size) and reused by the next run; ``--remeasure``
   measures again.
2. **The rollout replayed.** The records go into a fresh SQLite store at their own times, in the
   order they ended (as the recorder writes them), and a per-workload rollout (steps 50 %, 100 %)
   started at the first request is judged every 30 s of that timeline by ``advance_rollouts``, as
   the scheduler's rollout job runs it. ``rollout.interval`` is ``--interval-min``, by default a
   third of the measurement's length (whole minutes), not 30 minutes: one request at a time on 2
   cores, the judge's minimum of requests arrives only near the measurement's end, and a step
   passes only at an interval's end. The other judge settings are the defaults. After the last
   request the job goes on running with no new requests until the rollout ends or its holds run
   out.
3. **The judge's error rates on these requests**: benchmarks/rollout.py's simulation (a store per
   rollout, ``advance_rollouts`` every simulated minute, 30-minute intervals, 30 requests a side
   per interval), each side's requests drawn whole, with replacement, from the measured ones: per
   workload an A/A row (both sides drawn from the current drafters' requests) and the candidate
   against the current drafters.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import count
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks.results import write_section
from benchmarks.rollout import Judging, Measured, Scenario, aa_table, simulate, step_table
from decoder.candidate import DRAFTER_KINDS, Candidate, parse_candidate
from decoder.models.fetch import cache_dir
from decoder.record import RequestRecord
from decoder.workloads import builtin_workloads
from monitor.demo.scenario import FULL, QUICK
from monitor.demo.scenario import Scenario as Pair
from monitor.proxy.rollout import advance_rollouts, start_rollout
from monitor.proxy.settings import ProxySettings, RolloutSettings
from monitor.store.engine import create_engine
from monitor.store.migrate import upgrade
from monitor.store.rollouts import SERVED_MODES, RolloutEvent, get_rollout
from monitor.store.writes.writer import write_batch

TITLE = "Rollout on the Qwen pair (benchmarks/rollout_pair.py)"
NAME = "draft-only"  # the candidate's name in the records, as ``rollout start --drafter`` gives it
SHARE = 0.5  # the rollout's first step
TICK = timedelta(seconds=30)
TEMPERATURE = 0.7


@dataclass(frozen=True, slots=True)
class FirstStep:
    """A rollout's first step as the decoder reads it (decoder.candidate.Staging): the candidate on half of every
    workload."""

    drafter: str = NAME

    def share(self, workload: str) -> float:
        return SHARE


def side_of(record: RequestRecord) -> str | None:
    """``candidate``, ``current`` or None (a held-out request, judged on neither side)."""
    if record.mode not in SERVED_MODES:
        return None
    return "candidate" if record.drafter == NAME else "current" if record.drafter in DRAFTER_KINDS else None


def measure(pair: Pair, candidate: Candidate, workloads: Sequence[str], per_side: int) -> list[RequestRecord]:
    """Requests through the decoder of the demo's ``pair``, its candidate staged on half, until each workload has
    ``per_side`` requests on each side."""
    from decoder.speculation.controller import SpeculationController

    decoder = pair.decoder(candidate=candidate)
    decoder.controller = SpeculationController(seed=0)
    decoder.calibrate_if_needed()  # as the sidecar does at start, out of the first request
    decoder.staging = FirstStep()
    prompts = builtin_workloads()
    sides: Counter[tuple[str, str | None]] = Counter()
    records: list[RequestRecord] = []
    with tqdm(total=2 * per_side * len(workloads), desc="requests, each side", unit="req") as bar:
        for k in count():
            open_ = [w for w in workloads if min(sides[(w, "candidate")], sides[(w, "current")]) < per_side]
            if not open_:
                break
            workload = open_[k % len(open_)]
            ask = prompts[workload][(k // len(open_)) % len(prompts[workload])]
            record = decoder.generate(ask, workload=workload, chat=True, max_new_tokens=pair.max_new_tokens,
                                      temperature=TEMPERATURE, seed=k).record  # fmt: skip
            records.append(record)
            side = side_of(record)
            if side is not None and sides[(workload, side)] < per_side:
                bar.update()
            sides[(workload, side)] += 1
            bar.set_postfix_str(f"{workload} {side or 'holdout'} {record.decode_ms_per_token or 0:.0f} ms/token")
    return records


def load_or_measure(
    path: Path, pair: Pair, candidate: Candidate, workloads: Sequence[str], per_side: int
) -> tuple[list[RequestRecord], str]:
    """The kept records at ``path``, else new ones measured and kept there; and where they came from."""
    if path.exists():
        records = [RequestRecord.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line]
        return records, f"measured at {min(r.ts_start for r in records):%Y-%m-%d %H:%M} UTC, reused from {path.name}"
    t0 = time.perf_counter()
    records = measure(pair, candidate, workloads, per_side)
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    return records, f"measured in {time.perf_counter() - t0:.0f} s"


def median_of(records: Sequence[RequestRecord], attribute: str) -> float:
    values = [v for r in records if (v := getattr(r, attribute)) is not None]
    return float(np.median(values)) if values else math.nan


def log_sd(records: Sequence[RequestRecord]) -> float:
    return float(np.std(np.log([r.decode_ms_per_token for r in records if r.decode_ms_per_token])))


def measured_table(records: Sequence[RequestRecord], workloads: Sequence[str]) -> list[str]:
    lines = [
        "| workload | side | requests (speculative / plain) | decode ms per token, median | log sd | × current "
        "(speed) | acceptance | TTFT ms, median |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for w in workloads:
        by_side = {s: [r for r in records if r.workload == w and side_of(r) == s] for s in ("current", "candidate")}
        base = median_of(by_side["current"], "decode_ms_per_token")
        for side, mine in by_side.items():
            modes = Counter(r.mode for r in mine)
            drafted = sum(r.num_draft_tokens for r in mine)
            acceptance = f"{sum(r.num_accepted_tokens for r in mine) / drafted:.2f}" if drafted else "–"
            ms = median_of(mine, "decode_ms_per_token")
            lines.append(
                f"| {w} | {side} | {len(mine)} ({modes['speculative']} / {modes['plain']}) | {ms:.1f} | "
                f"{log_sd(mine):.2f} | {base / ms:.2f}× | {acceptance} | {median_of(mine, 'ttft_ms'):.0f} |"
            )
    return lines


def replay(
    records: Sequence[RequestRecord], candidate: Candidate, interval: timedelta, judging: Judging | None = None
) -> list[str]:
    """The rollout judged along the records' own timeline (module docstring, 2.): a line per event."""
    judging = judging or Judging()
    settings = RolloutSettings(steps=(SHARE, 1.0), interval=interval, per_workload=True, drafter=NAME,
                               tolerance=judging.tolerance, min_requests=judging.min_requests,
                               ci_level=judging.ci)  # fmt: skip
    ordered = sorted(records, key=lambda r: r.ts_end)
    t0 = min(r.ts_start for r in records) - timedelta(seconds=1)
    last = ordered[-1].ts_end
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(f"sqlite:///{Path(tmp) / 'replay.sqlite'}")
        upgrade(engine)
        rollout = start_rollout(engine, ProxySettings(), settings, t0, embedded=candidate)
        assert rollout.id is not None
        written, now = 0, t0
        horizon = last + (settings.max_holds + 1) * interval
        while now < horizon:
            now += TICK
            ended = [r for r in ordered[written:] if r.ts_end <= now]
            if ended:
                with engine.begin() as conn:
                    write_batch(conn, ended, f"replay-{written}", "sync")
                written += len(ended)
            for event in advance_rollouts(engine, settings, now):
                lines.append(event_line(event, now, t0, last, ordered[:written]))
            stored = get_rollout(engine, rollout.id)
            if stored is None or stored.status != "running":
                break
        engine.dispose()
    return lines


def event_line(event: RolloutEvent, now: datetime, t0: datetime, last: datetime, seen: Sequence[RequestRecord]) -> str:
    minute = (now - t0).total_seconds() / 60
    after = " (after the last request)" if now > last else ""
    served = Counter(r.workload for r in seen if side_of(r) == "candidate")
    counts = ", ".join(f"{w} {n}" for w, n in sorted(served.items()))
    return (
        f"- minute {minute:.1f}{after}: **{event.kind}**, candidate requests so far: {counts}. “{event.reason[:300]}”"
    )


def scenarios(records: Sequence[RequestRecord], workloads: Sequence[str], candidate: str, runs: int) -> list[Scenario]:
    """Per workload: A/A on the current drafters' requests, then the candidate's requests against them."""
    rows = []
    for w in workloads:
        current = [r for r in records if r.workload == w and side_of(r) == "current"]
        staged = [r for r in records if r.workload == w and side_of(r) == "candidate"]
        speed = median_of(current, "decode_ms_per_token") / median_of(staged, "decode_ms_per_token")
        pool = Measured.of(current)
        rows.append(
            Scenario(f"{w}: A/A", 1.0, 60, (SHARE, 1.0), round(log_sd(current), 2), runs, measured=(pool, pool))
        )
        rows.append(Scenario(f"{w}: {candidate}", speed, 60, (SHARE, 1.0), round(log_sd(staged), 2), runs,
                             measured=(Measured.of(staged), pool)))  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=36, help="requests per workload and side (default 36)")
    parser.add_argument("--workloads", default="extract,prose", help="built-in workloads (default extract,prose)")
    parser.add_argument("--candidate", default="model:qwen-coder-0.5b",
                        help="the candidate, as serve --candidate-drafter takes it (default %(default)s)")  # fmt: skip
    parser.add_argument("--remeasure", action="store_true", help="measure again rather than reuse the kept records")
    parser.add_argument("--interval-min", type=float,
                        help="the replay's rollout.interval, minutes (default: a third of the measuring)")  # fmt: skip
    parser.add_argument("--runs", type=int, default=200, help="simulated rollouts per row (default 200)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulation processes (default: CPUs)")
    parser.add_argument("--seed", type=int, default=2026, help="the simulation's seeds follow from it (default 2026)")
    parser.add_argument("--ci", type=float, default=RolloutSettings().ci_level,
                        help="the judge's interval level, rollout.ci_level, in the replay and the simulation "
                        "(default %(default)s)")  # fmt: skip
    parser.add_argument("--min-requests", type=int, default=RolloutSettings().min_requests,
                        help="rollout.min_requests in the replay and the simulation (default %(default)s)")  # fmt: skip
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS.md")
    parser.add_argument("--quick", action="store_true",
                        help="to check that it works: the quick demo's smollm2-135m with the n-gram drafter, "
                        "the target as its own draft as the candidate, 12 a side, 8 runs a row; no write")  # fmt: skip
    args = parser.parse_args(argv)
    pair = QUICK if args.quick else FULL
    if args.quick:
        args.candidate, args.requests, args.runs, args.no_write = "model:smollm2-135m", 12, 8, True
    candidate = parse_candidate(args.candidate)
    if candidate is None:
        parser.error("--candidate: expected a drafter, such as model:qwen-coder-0.5b or ngram:1-2")
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(workloads) - set(builtin_workloads()))
    if unknown:
        parser.error(f"--workloads: {', '.join(unknown)} not built in (choose from {', '.join(builtin_workloads())})")
    load = os.getloadavg()
    kept = (
        cache_dir()
        / "benchmarks"
        / (f"rollout-pair-{pair.target}-{candidate}-{'+'.join(workloads)}-{args.requests}.jsonl".replace(":", "_"))
    )
    if args.remeasure:
        kept.unlink(missing_ok=True)
    kept.parent.mkdir(parents=True, exist_ok=True)
    records, how = load_or_measure(kept, pair, candidate, workloads, args.requests)
    minutes = (max(r.ts_end for r in records) - min(r.ts_start for r in records)).total_seconds() / 60
    interval = args.interval_min or max(1, math.ceil(minutes / 3))
    judging = Judging(min_requests=args.min_requests, ci=args.ci)
    events = replay(records, candidate, timedelta(minutes=interval), judging)
    rows = list(enumerate(scenarios(records, workloads, str(candidate), args.runs)))
    t0 = time.perf_counter()
    figures = simulate(rows, judging, args.seed, args.jobs)
    body = "\n".join([
        f"Pair: `{' '.join(pair.model_arguments)}` (the {pair.name} demo's), candidate `{candidate}` staged on "
        f"{SHARE:.0%} of each workload's requests as `{NAME}`; {pair.max_new_tokens} new tokens, temperature "
        f"{TEMPERATURE}, one request at a time. Records: {len(records)}, {how}, over {minutes:.1f} minutes of "
        "requests (holdout requests are on neither side).",
        "",
        "### 1. Measured",
        "",
        *measured_table(records, workloads),
        "",
        f"### 2. The rollout replayed (steps 50 %, 100 %, per workload; rollout.interval {interval:g} min, "
        f"min_requests {judging.min_requests}, interval level {judging.ci:g}, other settings the defaults; judged "
        "every 30 s)",
        "",
        *(events or ["- no event: the rollout was still at its first step, held by nothing"]),
        "",
        "### 3. The judge's error rates on these requests (simulation, requests drawn from section 1's)",
        "",
        f"Judge: tolerance {judging.tolerance:g}, min_requests {judging.min_requests}, interval level {judging.ci:g}; "
        "rollout.interval 30 min, max_holds 3; 30 requests a side per interval; each row a rollout's first step "
        "(50 %) until it advances or is rolled back. The speed column is the measured ratio of medians; sd the "
        "measured log sd of the candidate's side.",
        "",
        *step_table(figures, judging.min_requests),
        "",
        *aa_table([f for f in figures if f.scenario.name.endswith("A/A")]),
        "",
        f"{sum(len(f.runs) for f in figures)} simulated rollouts on {args.jobs} processes in "
        f"{time.perf_counter() - t0:.0f} s. Load average (1 min) at start / end: {load[0]:.1f} / "
        f"{os.getloadavg()[0]:.1f}.",
    ])  # fmt: skip
    print(body)
    if not args.no_write:
        write_section(TITLE, body, ["-m", "benchmarks.rollout_pair", *(argv if argv is not None else sys.argv[1:])])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
