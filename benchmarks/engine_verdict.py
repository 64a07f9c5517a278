"""draftwatch's measured speedup against llama.cpp's own timings, per workload, in one run.

    python -m benchmarks.engine_verdict [--quick | --ngram] [--requests 30] [--max-tokens 32]
                                        [--workloads extract,prose] [--no-write]

Two llama-servers on the same target GGUF, one core each (so that neither waits for the other's
threads): a plain one, and a speculative one (default: qwen-coder-1.5b with the qwen-coder-0.5b
draft model; ``--ngram``: qwen-coder-1.5b with llama.cpp's prompt-lookup drafter, ``ngram-simple``;
``--quick``: smollm2-135m with the n-gram drafter and fewer requests). The sidecar runs
in proxy mode in this process (uvicorn, SQLite in a temporary directory) with the plain server as
its baseline and a holdout share of 0.5, so each workload's requests alternate between the two.
Nothing but the baseline declares which pool speculates (``proxy.speculative`` stays ``auto``): a
request the n-gram drafter found no match for carries no draft counts and must still be counted
speculative (issue 36); the table says how many did.
Prompts are the built-in Spec-Bench-style workloads (decoder/data/workloads.json), cycled; requests
go one at a time, so both sides run at the same load.

Truth, apart from draftwatch: each round also sends the round's prompt straight to both servers,
around the sidecar, and the truth is the mean of llama.cpp's own ``timings.predicted_per_token_ms``
of those direct answers on the plain server over that on the speculative one. These are other
requests than the ones draftwatch recorded (the same prompts, in the same minutes), so the truth
does not share draftwatch's numbers. draftwatch's figure is the drift run's ``net_loss`` speedup
(decode ms per token, stratified by context length and load) with its 95 % interval and verdict,
from one drift run whose current window holds the whole run.

Target (issue 31): within ±10 % of the truth on every workload with at least 30 requests a side; a
workload the truth shows slower is ``net_loss`` after that one window.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from benchmarks.results import write_section

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = json.loads((ROOT / "decoder/data/workloads.json").read_text())["workloads"]
NGRAM = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8")
# One core per server on a 2-core machine; its own context per server, one slot, as the tests use.
SERVER_ARGS = ("--ctx-size", "4096", "--parallel", "1", "--seed", "0", "--threads", "1")
TITLE = "Engine verdict: draftwatch's speedup against llama.cpp's timings (benchmarks/engine_verdict.py)"


@contextmanager
def sidecar(db_url: str, data_dir: Path, plain: str, speculative: str, min_requests: int) -> Iterator[tuple[str, Any]]:
    from monitor.api.app import create_app
    from monitor.config import Settings
    from tests.serving import serving

    environ = {
        "HOME": str(data_dir), "DRAFTWATCH_DATA_DIR": str(data_dir), "DRAFTWATCH_DATABASE_URL": db_url,
        "DRAFTWATCH_API_TOKENS": "", "DRAFTWATCH_PROXY_UPSTREAM": speculative,
        "DRAFTWATCH_PROXY_BASELINE_UPSTREAM": plain, "DRAFTWATCH_PROXY_KIND": "llamacpp",
        # Every other request of a workload to the baseline: equal sides, alternating in time.
        "DRAFTWATCH_DECODER_HOLDOUT_SHARE": "0.5", "DRAFTWATCH_DECODER_HOLDOUT_MAX_SHARE": "0.5",
        "DRAFTWATCH_DECODER_HOLDOUT_TARGET": "0",
        "DRAFTWATCH_DRIFT_MIN_REQUESTS": str(min_requests),
        # One window holds the whole run.
        "DRAFTWATCH_DRIFT_CURRENT_WINDOW": "3h", "DRAFTWATCH_DRIFT_MAX_CURRENT_WINDOW": "3h",
        "DRAFTWATCH_DRIFT_REFERENCE_WINDOW": "3h",
    }  # fmt: skip
    settings = Settings.from_env(environ, None)
    app = create_app(settings)
    with serving(app, log_level="warning") as url:
        yield url, (app, settings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--quick", action="store_true", help="smollm2-135m with the n-gram drafter, 10 a side")
    kind.add_argument("--ngram", action="store_true", help="qwen-coder-1.5b with the n-gram drafter (ngram-simple)")
    parser.add_argument("--requests", type=int, help="requests a side per workload (default 30; --quick 10)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--workloads", default="extract,prose", help="comma-separated, of decoder/data/workloads.json")
    parser.add_argument("--no-write", action="store_true", help="print only; RESULTS.md untouched")
    args = parser.parse_args(argv)
    per_side = args.requests or (10 if args.quick else 30)
    workloads = args.workloads.split(",")

    from decoder.models.fetch import fetch_preset
    from monitor.drift.run import run_drift
    from monitor.drift.verdict import verdict_of
    from monitor.store.engine import create_engine
    from tests.proxy.engine import rows
    from tests.stacks.llama_server import binary_path, llama_server

    binary = binary_path()
    if binary is None:
        print("llama-server is not built: run `bash scripts/ensure-llama-server.sh`", file=sys.stderr)
        return 2
    if args.quick or args.ngram:
        model = "smollm2-135m" if args.quick else "qwen-coder-1.5b"
        target = fetch_preset(model, progress=False)
        spec_args: tuple[str, ...] = NGRAM
        pair = f"{model}, n-gram drafter (ngram-simple, n 3, m 8)"
    else:
        target = fetch_preset("qwen-coder-1.5b", progress=False)
        draft = fetch_preset("qwen-coder-0.5b", progress=False)
        spec_args = ("--spec-type", "draft-simple", "--spec-draft-model", str(draft), "--threads-draft", "1")
        pair = "qwen-coder-1.5b target, qwen-coder-0.5b draft model (draft-simple, llama.cpp's default draft length)"
    load_before = os.getloadavg()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="draftwatch-engine-verdict-") as tmp, ExitStack() as stack:
        plain = stack.enter_context(llama_server(target, *SERVER_ARGS, binary=binary))
        spec = stack.enter_context(llama_server(target, *SERVER_ARGS, *spec_args, binary=binary))
        db_url = f"sqlite:///{Path(tmp) / 'draftwatch.db'}"
        url, (app, settings) = stack.enter_context(sidecar(db_url, Path(tmp), plain.url, spec.url, min(30, per_side)))
        client = stack.enter_context(httpx.Client(timeout=600))
        direct: dict[tuple[str, str], list[float]] = {(w, side): [] for w in workloads for side in ("plain", "spec")}
        traffic_start = time.monotonic()

        def per_token_ms(base: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> float:
            answer = client.post(f"{base}/v1/chat/completions", json=body, headers=headers)
            answer.raise_for_status()
            return float(answer.json()["timings"]["predicted_per_token_ms"])

        for i in range(2 * per_side):
            for workload in workloads:
                prompts = WORKLOADS[workload]
                body = {"messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                        "max_tokens": args.max_tokens, "temperature": 0}  # fmt: skip
                per_token_ms(url, body, {"X-Workload": workload})
                if i % 2 == 0:  # per_side direct requests a side, the prompts of the even rounds
                    direct[(workload, "plain")].append(per_token_ms(plain.url, body))
                    direct[(workload, "spec")].append(per_token_ms(spec.url, body))
            print(f"round {i + 1}/{2 * per_side} done after {time.monotonic() - traffic_start:.0f} s", flush=True)
        traffic_s = time.monotonic() - traffic_start
        assert app.state.api.recorder.flush(30)
        engine = create_engine(db_url)
        run = run_drift(engine, settings.drift, datetime.now(UTC) + timedelta(seconds=1))
        recorded = [r for r in rows(db_url) if r["finish_reason"] != "error"]
        engine.dispose()
    load_after = os.getloadavg()

    found = {r.workload: r for r in run.results if r.test == "net_loss"}
    lines = [
        f"Pair: {pair}; {per_side} proxied requests a side per workload (holdout share 0.5) and {per_side} sent "
        f"straight to each server for the truth, {args.max_tokens} new tokens, greedy, one request at a time; each "
        "llama-server on 1 thread.",
        f"Traffic took {traffic_s:.0f} s (whole run {time.monotonic() - started:.0f} s); one drift run over one window "
        "holding all of it. Load average (1 min) before / after: "
        f"{load_before[0]:.1f} / {load_after[0]:.1f}.",
        "",
        "| workload | recorded holdout / spec (drafted nothing) / plain | truth (llama.cpp, direct) "
        "| draftwatch speedup [95 % CI] | verdict | error | losing found |",
        "|---|---|---|---|---|---|---|",
    ]
    worst: float | None = None
    for workload in workloads:
        n_plain = sum(r["workload"] == workload and r["mode"] == "holdout" for r in recorded)
        n_spec = sum(r["workload"] == workload and r["mode"] == "speculative" for r in recorded)
        n_idle = sum(r["workload"] == workload and r["mode"] == "speculative" and not r["num_draft_tokens"]
                     for r in recorded)  # fmt: skip
        n_inferred = sum(r["workload"] == workload and r["mode"] == "plain" for r in recorded)
        truth = statistics.mean(direct[(workload, "plain")]) / statistics.mean(direct[(workload, "spec")])
        result = found.get(workload)
        verdict = verdict_of(result) if result is not None else None
        speedup = result.effect if result is not None else None
        error = (speedup / truth - 1) * 100 if speedup else float("nan")
        if n_plain >= 30 and n_spec >= 30:
            worst = max(worst or 0.0, abs(error))
        ci = result.ci if result is not None and result.ci else (float("nan"), float("nan"))
        shown = f"{speedup:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}]" if speedup else "none"
        losing = ("yes" if verdict and verdict.verdict == "net_loss" else "NO") if truth < 1 else "-"
        lines.append(
            f"| {workload} | {n_plain} / {n_spec} ({n_idle}) / {n_inferred} | {truth:.2f}x | {shown} | "
            f"{verdict.verdict if verdict else 'none'} | {error:+.1f} % | {losing} |"
        )
    largest = "no workload has that many" if worst is None else f"{worst:.1f} %"
    lines += ["", f"Largest error on workloads with >= 30 requests a side: {largest} (target: within 10 %)."]
    report = "\n".join(lines)
    print(report)
    if not args.no_write:
        write_section(
            TITLE + (" --quick" if args.quick else " --ngram" if args.ngram else ""),
            report,
            ["benchmarks/engine_verdict.py", *sys.argv[1:]],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
