"""Why acceptance fell, checked against known truth: real llama-server records resampled with staged changes.

    python -m benchmarks.explain_replay [--trials 100] [--aa-trials 300] [--requests 2000] [--collect] [--no-write]

The pool: real requests answered by llama-server (smollm2-135m, llama.cpp's n-gram drafter
``ngram-simple``, n 3, m 8; two servers of one core each) to three built-in workloads of
decoder/data/workloads.json (``extract`` copies from its prompt, ``code-edit`` rewrites code it is
given, ``prose`` writes something new) as chat requests, every prompt under two system prompts
(plain, and one asking never to repeat the user's words), at temperature 0 and 0.8, with 32 and 96 tokens to
answer. Each record keeps llama.cpp's own draft counts (``timings.draft_n``, ``draft_n_accepted``)
and the factors the proxy would record, computed by the product's own functions (the style
fingerprint and copy share of decoder/causes.py). The pool is cached under
``~/.cache/draftwatch/benchmarks/`` and collected again when absent (a few minutes).

A window is drawn from the pool by a composition: each workload's share, and per workload the
chance of the paraphrasing system prompt, of temperature 0.8, of the 96-token answer, and of a second
drafter version ``v2``, whose records are v1 records with their accepted drafts thinned to 60 %
(binomially: the drafter got worse). Records are drawn with replacement within their cell. The
reference composition: workloads a third each, plain prompts, 20 % at T 0.8, 30 % long answers,
v1 only. Each scenario changes one thing in the current window:

* ``A/A``: nothing;
* ``mix``: the shares move to prose (extract 10 %, code-edit 30 %, prose 60 %);
* ``style``: 60 % of extract's requests get the paraphrasing system prompt;
* ``sampling``: 80 % of code-edit's requests at T 0.8;
* ``length``: 90 % of extract's requests with 96-token answers;
* ``version``: half of extract's requests served by v2.

The truth of each part is the split of two windows of 200,000 requests each of the same
compositions (Level 2 run on every workload), where sampling noise is negligible. Each trial draws
``--requests`` requests a window and runs the drift run's split (Level 1, then Level 2 on the
named within parts, 500 replicates, BH 0.01). Reported per scenario: how often the staged part
was split out (its workload's within part named), how often its 95 % interval held the truth, and
how often the largest named part was the staged one; under A/A, how often anything was named.
Targets (issue 50): the true part inside its interval in >= 90 % of trials, the largest named
cause right in >= 95 %, and no cause named in >= 99 % of A/A runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.results import write_section
from decoder.causes import copy_share, prompt_text, style_fingerprint
from monitor.drift.explain import Explanation, Part, Stratum, explain
from monitor.drift.explain_factors import RequestFactors, Requests, label_requests, split_named, split_within

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = json.loads((ROOT / "decoder/data/workloads.json").read_text())["workloads"]
NAMES = ("extract", "code-edit", "prose")
SYSTEMS = {
    "plain": "You are a helpful assistant.",
    "paraphrase": "Never repeat the user's words: say everything in your own words.",
}
TEMPERATURES = (0.0, 0.8)
MAX_TOKENS = (32, 96)
NGRAM = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8")
SERVER_ARGS = ("--ctx-size", "4096", "--parallel", "1", "--seed", "0", "--threads", "1")
POOL = Path.home() / ".cache/draftwatch/benchmarks/explain_pool.json"
THINNED = 0.6
TITLE = "Why acceptance fell, against known truth (benchmarks/explain_replay.py)"
LEVEL, MIN_REQUESTS, N_BOOT = 0.01, 30, 500


@dataclass(frozen=True)
class Composition:
    """Workload shares, and per workload the chance of each non-default cell value."""

    shares: Mapping[str, float]
    paraphrase: Mapping[str, float] = field(default_factory=dict)
    hot: Mapping[str, float] = field(default_factory=dict)  # temperature 0.8
    long: Mapping[str, float] = field(default_factory=dict)  # 96 tokens to answer
    v2: Mapping[str, float] = field(default_factory=dict)

    def chance(self, what: str, workload: str) -> float:
        defaults = {"paraphrase": 0.0, "hot": 0.2, "long": 0.3, "v2": 0.0}
        return float(dict(getattr(self, what)).get(workload, defaults[what]))


REFERENCE = Composition({w: 1 / 3 for w in NAMES})
SCENARIOS: dict[str, tuple[Composition, tuple[str, str | None] | None]] = {
    "A/A": (REFERENCE, None),
    "mix": (Composition({"extract": 0.1, "code-edit": 0.3, "prose": 0.6}), ("mix", None)),
    "style": (Composition(REFERENCE.shares, paraphrase={"extract": 0.6}), ("style", "extract")),
    "sampling": (Composition(REFERENCE.shares, hot={"code-edit": 0.8}), ("sampling", "code-edit")),
    "length": (Composition(REFERENCE.shares, long={"extract": 0.9}), ("length", "extract")),
    "version": (Composition(REFERENCE.shares, v2={"extract": 0.5}), ("version", "extract")),
}


def collect(path: Path) -> list[dict[str, Any]]:
    """Ask two llama-servers every (workload, prompt, system prompt, temperature, answer length); keep each record."""
    from decoder.models.fetch import fetch_preset
    from tests.stacks.llama_server import binary_path, llama_server

    binary = binary_path()
    if binary is None:
        raise SystemExit("llama-server is not built: run `bash scripts/ensure-llama-server.sh`")
    model = fetch_preset("smollm2-135m", progress=False)
    # At temperature 0.8 each ask three times, with its own seed: sampled answers differ.
    asks = [
        (w, prompt, system, t, m)
        for w in NAMES
        for prompt in WORKLOADS[w]
        for system in SYSTEMS
        for t in TEMPERATURES
        for m in MAX_TOKENS
        for _ in range(3 if t > 0 else 1)
    ]
    records: list[dict[str, Any]] = []
    with ExitStack() as stack:
        urls = [stack.enter_context(llama_server(model, *SERVER_ARGS, *NGRAM, binary=binary)).url for _ in range(2)]
        client = stack.enter_context(httpx.Client(timeout=600))

        def one(i: int) -> dict[str, Any]:
            workload, prompt, system, temperature, max_tokens = asks[i]
            messages = [{"role": "system", "content": SYSTEMS[system]}, {"role": "user", "content": prompt}]
            body = {"messages": messages, "temperature": temperature, "max_tokens": max_tokens, "seed": i}
            answer = client.post(f"{urls[i % 2]}/v1/chat/completions", json=body).json()
            text = answer["choices"][0]["message"]["content"] or ""
            return {
                "workload": workload,
                "system": system,
                "hot": temperature > 0,
                "long": max_tokens == MAX_TOKENS[1],
                "drafted": answer["timings"].get("draft_n", 0),
                "accepted": answer["timings"].get("draft_n_accepted", 0),
                "prompt_tokens": answer["usage"]["prompt_tokens"],
                "output_tokens": answer["usage"]["completion_tokens"],
                "temperature": temperature,
                "style_hash": style_fingerprint(body),
                "copy_share": copy_share(prompt_text(body), text),
            }

        with ThreadPoolExecutor(2) as pool:
            for done, record in enumerate(pool.map(one, range(len(asks))), 1):
                records.append(record)
                print(f"\rcollecting the pool: {done}/{len(asks)} requests", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records))
    return records


class Pool:
    """The drafting records per cell (workload, system prompt, hot, long)."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.cells: dict[tuple[str, str, bool, bool], list[dict[str, Any]]] = {}
        for r in records:
            if r["drafted"] > 0:
                self.cells.setdefault((r["workload"], r["system"], r["hot"], r["long"]), []).append(r)

    def window(self, rng: np.random.Generator, c: Composition, n: int) -> dict[str, Requests]:
        counts = rng.multinomial(n, [c.shares[w] for w in NAMES])
        out = {}
        for workload, count in zip(NAMES, counts, strict=True):
            drafted, accepted, rows = [], [], []
            draws = {what: rng.random(count) < c.chance(what, workload) for what in ("paraphrase", "hot", "long", "v2")}
            for i in range(count):
                system = "paraphrase" if draws["paraphrase"][i] else "plain"
                cell = self.cells[(workload, system, bool(draws["hot"][i]), bool(draws["long"][i]))]
                r = cell[int(rng.integers(len(cell)))]
                v2 = bool(draws["v2"][i])
                drafted.append(r["drafted"])
                accepted.append(rng.binomial(r["accepted"], THINNED) if v2 else r["accepted"])
                rows.append(factors(r, "v2" if v2 else "v1"))
            out[workload] = label_requests(np.array(drafted, float), np.array(accepted, float), rows)
        return out


def factors(r: Mapping[str, Any], version: str) -> RequestFactors:
    return RequestFactors(
        r["prompt_tokens"], r["output_tokens"], r["temperature"], 1.0, 8, r["style_hash"], r["copy_share"],
        "ngram", None, version, None, None, None,
    )  # fmt: skip


def split(ref: Mapping[str, Requests], cur: Mapping[str, Requests], seed: int, n_boot: int = N_BOOT) -> Explanation:
    """The drift run's split of two drawn windows: Level 1, then Level 2 on the named within parts."""
    strata = [Stratum(k, w, win[w].drafted, win[w].accepted) for k, win in enumerate((ref, cur)) for w in NAMES]
    level1 = explain(strata, min_requests=MIN_REQUESTS, n_boot=n_boot, seed=seed, fdr_level=LEVEL)
    return split_named(
        level1, lambda w: (ref[w], cur[w]), min_requests=MIN_REQUESTS, n_boot=n_boot, seed_of=lambda w: seed + 1,
        fdr_level=LEVEL,
    )  # fmt: skip


def truth(pool: Pool, composition: Composition, rng: np.random.Generator) -> dict[tuple[str, str | None], float]:
    """Every part of the split of two 200,000-request windows, Level 2 on every workload."""
    ref, cur = pool.window(rng, REFERENCE, 200_000), pool.window(rng, composition, 200_000)
    strata = [Stratum(k, w, win[w].drafted, win[w].accepted) for k, win in enumerate((ref, cur)) for w in NAMES]
    level1 = explain(strata, min_requests=MIN_REQUESTS, n_boot=20, seed=0, fdr_level=LEVEL)
    parts: dict[tuple[str, str | None], float] = {(p.cause, p.workload): p.value for p in level1.parts}
    for p in level1.parts:
        if p.cause == "within" and p.workload is not None:
            weight = (p.detail["share_ref"] + p.detail["share_cur"]) / 2
            for q in split_within((ref[p.workload], cur[p.workload]), p.workload, weight, min_requests=MIN_REQUESTS,
                                  n_boot=20, seed=0, fdr_level=LEVEL, total=p.value):  # fmt: skip
                parts[(q.cause, q.workload)] = q.value
    return parts


def share(k: int, n: int) -> str:
    return f"{k / n:.1%} ({k}/{n})" if n else "-"


def largest_named(e: Explanation, staged: tuple[str, str | None]) -> Part | None:
    """The largest named cause where the staged one competes: the mix among run-wide parts, a Level 2
    cause among its workload's (a staged change can also move the mix: longer answers draft more)."""
    cause, workload = staged
    named = [p for p in e.parts if p.named and p.cause not in ("within", "unexplained")]
    named = [p for p in named if p.workload == workload] if cause != "mix" else named
    return max(named, key=lambda p: abs(p.value)) if named else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100, help="trials per staged change (default 100)")
    parser.add_argument("--aa-trials", type=int, default=300, help="A/A trials (default 300)")
    parser.add_argument("--requests", type=int, default=2000, help="requests per window (default 2,000)")
    parser.add_argument("--collect", action="store_true", help="collect the pool again even where it is cached")
    parser.add_argument("--no-write", action="store_true", help="print only; RESULTS.md untouched")
    args = parser.parse_args(argv)
    records = collect(POOL) if args.collect or not POOL.exists() else json.loads(POOL.read_text())
    pool = Pool(records)
    drafting = sum(len(c) for c in pool.cells.values())
    rates = {w: sum(r["accepted"] for k, c in pool.cells.items() if k[0] == w for r in c)
             / sum(r["drafted"] for k, c in pool.cells.items() if k[0] == w for r in c) for w in NAMES}  # fmt: skip
    print(f"pool: {len(records)} requests, {drafting} drafting; acceptance " +
          ", ".join(f"{w} {r:.2f}" for w, r in rates.items()), file=sys.stderr)  # fmt: skip
    rng = np.random.default_rng(2026)
    lines = [
        "| staged change | true part | split out | interval holds the truth | anything named | largest named is it | "
        "named instead |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    started = time.monotonic()
    for name, (composition, staged) in SCENARIOS.items():
        trials = args.aa_trials if staged is None else args.trials
        true = truth(pool, composition, rng)
        value = true.get(staged, 0.0) if staged else 0.0
        found = held = right = anything = decided = 0
        instead: Counter[str] = Counter()
        for t in range(trials):
            e = split(pool.window(rng, REFERENCE, args.requests), pool.window(rng, composition, args.requests), t)
            anything += any(p.named for p in e.parts)
            part = next((p for p in e.parts if staged and (p.cause, p.workload) == staged), None)
            if part is not None and part.low is not None and part.high is not None:
                found += 1
                held += part.low <= value <= part.high
            top = largest_named(e, staged) if staged is not None else None
            if top is not None:
                decided += 1
                right += (top.cause, top.workload) == staged
                instead.update([] if (top.cause, top.workload) == staged else [top.cause])
            elif staged is not None and any(p.named for p in e.parts):
                instead.update(p.cause for p in e.parts if p.named and p.cause != "within")
            print(f"\r{name}: {t + 1}/{trials}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        label = "nothing" if staged is None else f"{staged[0]}" + (f" within {staged[1]}" if staged[1] else "")
        lines.append(
            f"| {name}: {label} | {value:+.3f} | {share(found, trials)} | {share(held, found)} | "
            f"{share(anything, trials)} | {share(right, decided) if staged else '-'} | "
            f"{', '.join(f'{c} {k}' for c, k in instead.most_common(3)) or '-'} |"
        )
    body = "\n".join([
        f"Pool: {len(records)} real requests ({drafting} drafted), acceptance "
        + ", ".join(f"{w} {r:.2f}" for w, r in rates.items())
        + f"; {args.requests:,} requests a window, {args.trials} trials a change, {args.aa_trials} A/A; "
        f"{time.monotonic() - started:.0f} s.",
        "",
        *lines,
        "",
        "\"Split out\": the staged part was in the split (for a Level 2 cause, its workload's within part was named, "
        "so Level 2 ran). \"Interval holds the truth\": of those, its 95 % interval held the true part (two "
        "200,000-request windows). \"Largest named is it\": of the trials that named a cause where the staged one "
        "competes (the mix among the run-wide parts, a Level 2 cause among its workload's), those whose largest "
        "was the staged one; \"named instead\": what was named in the other trials that named anything (counts).",
    ])  # fmt: skip
    print(body)
    if not args.no_write:
        write_section(TITLE, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
