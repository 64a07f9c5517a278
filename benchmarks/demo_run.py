"""The default demo end to end: ``draftwatch demo --exit`` timed from its start to the acceptance alert.

    python -m benchmarks.demo_run              # fetches the default pair's models first, writes RESULTS.md
    python -m benchmarks.demo_run --no-write

The models are fetched before the clock starts (downloading is the network's time, not the demo's);
everything after that counts, the first conversion and quantization of the models included when the
cache has none yet. The demo runs as a subprocess with its output passed through; the benchmark
notes when each phase's line first appears, counts the requests in the demo's database afterwards
and writes the "Default demo" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decoder_speed import publish
from decoder.models.fetch import cache_dir, fetch_preset
from monitor.demo.scenario import FULL

TITLE = "Default demo (benchmarks/demo_run.py)"
TARGET_S = 600.0  # the demo's promise: the alert within 10 minutes of the models being fetched
# Phases in the order the demo reaches them: key, label, pattern of the line that marks the phase's start.
PHASES = (
    ("convert", "GGUF conversion starts", re.compile(r"Converting and de-quantizing")),
    ("quantize", "quantization starts", re.compile(r"quantizing to int")),
    ("calibrate", "timing the pair starts", re.compile(r"^timing the model pair")),
    ("ready", "models ready (converted, quantized, pair timed)", re.compile(r"^models ready in")),
    ("sidecar", "sidecar ready, traffic starts", re.compile(r"^sidecar ready in")),
    ("change", "the change", re.compile(r"^\*\*\* the change")),
    ("alert", "acceptance_drop alert received", re.compile(r"\[firing\] acceptance_drop workload=")),
)
# Where the demo's preparation leaves the converted and quantized copies of the models.
PREPARED = ("converted", "quantized")


@dataclass
class Run:
    """What one demo run showed: when each phase's line appeared, its exit status, the load it ran under."""

    seconds: dict[str, float] = field(default_factory=dict)  # by phase key
    status: int | None = None
    wall_s: float = 0.0
    load: list[float] = field(default_factory=list)  # 1-minute load average, sampled every 10 s

    def see(self, line: str, elapsed: float) -> None:
        for key, _, pattern in PHASES:
            if key not in self.seconds and pattern.search(line):
                self.seconds[key] = elapsed


def prepared_entries() -> set[str]:
    root = cache_dir()
    return {f"{kind}/{path.name}" for kind in PREPARED if (root / kind).is_dir() for path in (root / kind).iterdir()}


def run_demo(workdir: Path, timeout_s: float) -> Run:
    """Run ``draftwatch demo --exit``, passing its output through and timing its phases."""
    run = Run(load=[os.getloadavg()[0]])
    command = [sys.executable, "-m", "monitor.commands", "demo", "--exit", "--dir", str(workdir)]
    # Unbuffered, so that each line reaches us (and its timestamp) when the demo writes it.
    environ = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environ)
    assert child.stdout is not None
    stop_sampling = threading.Event()

    def sample_load() -> None:
        while not stop_sampling.wait(10.0):
            run.load.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample_load, daemon=True)
    sampler.start()
    timer = threading.Timer(timeout_s, lambda: child.send_signal(signal.SIGTERM))  # the demo stops its children
    timer.start()
    pending = ""
    try:
        while chunk := os.read(child.stdout.fileno(), 65536):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            # Progress bars redraw with carriage returns: each redraw is a line of its own here.
            *lines, pending = re.split(r"[\r\n]", pending + chunk.decode(errors="replace"))
            for line in lines:
                run.see(line, time.monotonic() - started)
        run.see(pending, time.monotonic() - started)
        run.status = child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGTERM)
        child.wait()
        raise
    finally:
        timer.cancel()
        stop_sampling.set()
    run.wall_s = time.monotonic() - started
    run.load.append(os.getloadavg()[0])
    return run


def count_requests(database: Path) -> dict[str, int]:
    """Requests stored by the demo's sidecar, per decoding mode."""
    if not database.is_file():
        return {}
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        return {mode: int(n) for mode, n in conn.execute("SELECT mode, count(*) FROM requests GROUP BY mode")}


def phase_s(run: Run, start: str, end: str) -> str:
    """Seconds from one phase's line to another's, as text ('?' where either is missing)."""
    if start not in run.seconds or end not in run.seconds:
        return "?"
    return f"{run.seconds[end] - run.seconds[start]:.0f} s"


def report(run: Run, requests: dict[str, int], new_entries: set[str]) -> str:
    rows = [f"| {label} | {run.seconds[key]:.0f} |" for key, label, _ in PHASES if key in run.seconds]
    rows.append(f"| demo exited (status {run.status}) | {run.wall_s:.0f} |")
    if new_entries:
        made = ", ".join(sorted(new_entries))
        cache = (
            f"cold: this run made the converted and quantized copies ({made}). The first conversion took "
            f"{phase_s(run, 'convert', 'quantize')}, quantization {phase_s(run, 'quantize', 'calibrate')}, "
            f"timing the pair {phase_s(run, 'calibrate', 'ready')}"
        )
    else:
        cache = f"warm: the converted and quantized copies were already in {cache_dir()}"
    alert_s = run.seconds.get("alert")
    if alert_s is None:
        outcome = f"no acceptance_drop alert arrived; the demo exited with status {run.status}"
    else:
        verdict = "within" if alert_s <= TARGET_S else "over"
        outcome = (
            f"acceptance_drop alert received after {alert_s:.0f} s ({alert_s / 60:.1f} min, {verdict} the "
            f"{TARGET_S / 60:.0f}-minute target), exit status {run.status}"
        )
    mix = ", ".join(f"{mode} {n}" for mode, n in sorted(requests.items()))
    return "\n".join(
        [
            f"`draftwatch demo --exit` on its default pair ({FULL.target} with the "
            f"{FULL.drafter} drafter, {', '.join(FULL.workloads)}; `{FULL.changed}` changes midway), a fresh "
            "SQLite database, the models fetched beforehand. Seconds from the command's start to the first line "
            "of each phase:",
            "",
            "| phase | seconds |",
            "| --- | ---: |",
            *rows,
            "",
            f"Outcome: {outcome}.  ",
            f"Time before traffic: {run.seconds.get('sidecar', 0.0):.0f} s (preparing the models, then the sidecar's "
            "start).  ",
            f"Cache: {cache}.  ",
            f"Requests stored: {sum(requests.values())} ({mix or 'none'}).",
            "",
            f"Load average (1 min) at start / end: {run.load[0]:.1f} / {run.load[-1]:.1f}, highest "
            f"{max(run.load):.1f} (sampled every 10 s). A load above "
            f"{os.cpu_count()} means the demo shared the CPU with other work, and every phase above ran slower for it.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    parser.add_argument("--timeout", type=float, default=1800.0, help="stop the demo after this many seconds")
    parser.add_argument("--dir", type=Path, default=None, help="the demo's directory (default: a temporary one)")
    args = parser.parse_args(argv)
    fetch_preset(FULL.target)
    before = prepared_entries()
    with tempfile.TemporaryDirectory(prefix="draftwatch-demo-run-") as scratch:
        workdir = args.dir or Path(scratch)
        run = run_demo(workdir, args.timeout)
        requests = count_requests(workdir / "draftwatch.db")
    publish(args, TITLE, report(run, requests, prepared_entries() - before))
    return 0 if run.status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
