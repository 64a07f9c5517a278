"""draftwatch's measured speedup against llama.cpp's own timings, per workload, in one run.

    python -m benchmarks.engine_verdict [--quick] [--requests 30] [--max-tokens 32]
                                        [--workloads extract,prose] [--no-write]

Two llama-servers on the same target GGUF, one core each (so that neither waits for the other's
threads): a plain one, and a speculative one (default: qwen-coder-1.5b with the qwen-coder-0.5b
draft model; ``--quick``: smollm2-135m with the n-gram drafter and fewer requests). The sidecar runs
in proxy mode in this process (uvicorn, SQLite in a temporary directory) with the plain server as
its baseline and a holdout share of 0.5, so each workload's requests alternate between the two.
Prompts are the built-in Spec-Bench-style workloads (decoder/data/workloads.json), cycled; requests
go one at a time, so both sides run at the same load.

Truth: per workload, the mean of llama.cpp's own ``timings.predicted_per_token_ms`` over the
requests the plain server answered, over that of the speculative server's, the same requests
draftwatch recorded (joined by response id). draftwatch's figure is the drift run's ``net_loss``
speedup (decode ms per token, stratified by context length) with its 95 % interval and verdict,
from one drift run whose current window holds the whole run. The proxy takes a llama.cpp request's
decode time from the same ``timings`` (``predicted_ms``), so the two agree closely by construction;
what the comparison checks is everything after: which side each request is recorded on, the
ms-per-token figure (per token after the first), the strata's weighting and the verdict.

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
import threading
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
    import uvicorn

    from monitor.api.app import create_app
    from monitor.config import Settings
    from tests.stacks.llama_server import free_port

    environ = {
        "HOME": str(data_dir), "DRAFTWATCH_DATA_DIR": str(data_dir), "DRAFTWATCH_DATABASE_URL": db_url,
        "DRAFTWATCH_API_TOKENS": "", "DRAFTWATCH_PROXY_UPSTREAM": speculative,
        "DRAFTWATCH_PROXY_BASELINE_UPSTREAM": plain, "DRAFTWATCH_PROXY_KIND": "llamacpp",
        # A speculative server's request that drafted nothing still decoded speculatively: it counts on that side.
        "DRAFTWATCH_PROXY_SPECULATIVE": "true",
        # Every other request of a workload to the baseline: equal sides, alternating in time.
        "DRAFTWATCH_HOLDOUT_SHARE": "0.5", "DRAFTWATCH_HOLDOUT_MAX_SHARE": "0.5", "DRAFTWATCH_HOLDOUT_TARGET": "0",
        "DRAFTWATCH_DRIFT_MIN_REQUESTS": str(min_requests),
        # One window holds the whole run.
        "DRAFTWATCH_DRIFT_CURRENT_WINDOW": "3h", "DRAFTWATCH_DRIFT_MAX_CURRENT_WINDOW": "3h",
        "DRAFTWATCH_DRIFT_REFERENCE_WINDOW": "3h",
    }  # fmt: skip
    settings = Settings.from_env(environ, None)
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", (app, settings)
    finally:
        server.should_exit = True
        thread.join(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smollm2-135m with the n-gram drafter, 10 a side")
    parser.add_argument("--requests", type=int, help="requests a side per workload (default 30; --quick 10)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--workloads", default="extract,prose", help="comma-separated, of decoder/data/workloads.json")
    parser.add_argument("--no-write", action="store_true", help="print only; RESULTS.md untouched")
    args = parser.parse_args(argv)
    per_side = args.requests or (10 if args.quick else 30)
    workloads = args.workloads.split(",")

    from decoder.fetch import fetch_preset
    from monitor.drift.run import run_drift
    from monitor.drift.verdict import verdict_of
    from monitor.store.engine import create_engine
    from tests.proxy.test_proxy import rows
    from tests.stacks.llama_server import binary_path, llama_server

    binary = binary_path()
    if binary is None:
        print("llama-server is not built: run `bash scripts/ensure-llama-server.sh`", file=sys.stderr)
        return 2
    if args.quick:
        target = fetch_preset("smollm2-135m", progress=False)
        spec_args: tuple[str, ...] = NGRAM
        pair = "smollm2-135m, n-gram drafter (ngram-simple, n 3, m 8)"
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
        timings: dict[str, tuple[str, float]] = {}
        traffic_start = time.monotonic()
        for i in range(2 * per_side):
            for workload in workloads:
                prompts = WORKLOADS[workload]
                body = {"messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                        "max_tokens": args.max_tokens, "temperature": 0}  # fmt: skip
                answer = client.post(f"{url}/v1/chat/completions", json=body, headers={"X-Workload": workload})
                answer.raise_for_status()
                data = answer.json()
                timings[data["id"]] = (workload, float(data["timings"]["predicted_per_token_ms"]))
            print(f"round {i + 1}/{2 * per_side} done after {time.monotonic() - traffic_start:.0f} s", flush=True)
        traffic_s = time.monotonic() - traffic_start
        assert app.state.api.recorder.flush(30)
        engine = create_engine(db_url)
        run = run_drift(engine, settings.drift, datetime.now(UTC) + timedelta(seconds=1))
        modes = {r["request_id"]: r["mode"] for r in rows(db_url)}
        engine.dispose()
    load_after = os.getloadavg()

    found = {r.workload: r for r in run.results if r.test == "net_loss"}
    lines = [
        f"Pair: {pair}; {per_side} requests a side per workload (holdout share 0.5), {args.max_tokens} new tokens, "
        "greedy, one request at a time; each llama-server on 1 thread.",
        f"Traffic took {traffic_s:.0f} s (whole run {time.monotonic() - started:.0f} s); one drift run over one window "
        "holding all of it. Load average (1 min) before / after: "
        f"{load_before[0]:.1f} / {load_after[0]:.1f} (other engineers' tests shared the 2 cores).",
        "",
        "| workload | plain / spec | truth (llama.cpp) | draftwatch speedup [95 % CI] | verdict | error "
        "| losing found |",
        "|---|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for workload in workloads:
        side: dict[str, list[float]] = {"holdout": [], "speculative": []}
        for rid, (w, ms) in timings.items():
            if w == workload and rid in modes:
                side[modes[rid]].append(ms)
        truth = statistics.mean(side["holdout"]) / statistics.mean(side["speculative"])
        result = found.get(workload)
        verdict = verdict_of(result) if result is not None else None
        speedup = result.effect if result is not None else None
        error = (speedup / truth - 1) * 100 if speedup else float("nan")
        if len(side["holdout"]) >= 30 and len(side["speculative"]) >= 30:
            worst = max(worst, abs(error))
        ci = result.ci if result is not None and result.ci else (float("nan"), float("nan"))
        shown = f"{speedup:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}]" if speedup else "none"
        losing = ("yes" if verdict and verdict.verdict == "net_loss" else "NO") if truth < 1 else "-"
        lines.append(
            f"| {workload} | {len(side['holdout'])} / {len(side['speculative'])} | {truth:.2f}x | {shown} | "
            f"{verdict.verdict if verdict else 'none'} | {error:+.1f} % | {losing} |"
        )
    lines += ["", f"Largest error on workloads with >= 30 requests a side: {worst:.1f} % (target: within 10 %)."]
    report = "\n".join(lines)
    print(report)
    if not args.no_write:
        write_section(
            TITLE + (" --quick" if args.quick else ""), report, ["benchmarks/engine_verdict.py", *sys.argv[1:]]
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
