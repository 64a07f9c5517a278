"""What relaying one server-sent event costs the sidecar, per event size: it must be linear.

    python -m benchmarks.relay_cost [--sizes 1,5,10,20,40] [--repeats 5] [--no-write]

A stub upstream (uvicorn, in this process) streams a chat whose middle event carries N MiB of logprobs
(as vLLM streams ``logprobs: true``), in 64 KiB writes; ``draftwatch serve --upstream`` runs as
deployed, with ``proxy.max_event_bytes`` above the largest size so that every event is read. Per size,
``--repeats`` streams: the client's median wall time and the sidecar's mean CPU time (user + system,
from /proc, summed over the repeats: it counts in 10 ms ticks), and the CPU per MiB. The relay is
linear when the CPU per MiB stays flat across sizes; the quadratic relay it replaces took 0.55 s of
CPU for 5 MiB and 39.5 s for 40 MiB. Figures go into RESULTS.md unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from benchmarks.http_ingest import free_port
from benchmarks.proxy_overhead import start_sidecar
from benchmarks.results import write_section

MEASURABLE_CPU_S = 0.05  # five clock ticks over a size's repeats

ENTRY = {"token": "hello", "logprob": -0.123456, "bytes": [104, 101, 108, 108, 111],
         "top_logprobs": [{"token": "hi", "logprob": -1.5, "bytes": [104, 105]}] * 2}  # fmt: skip
BASE = {"id": "chatcmpl-relay", "object": "chat.completion.chunk", "created": 1, "model": "stub"}
USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}


def events(size: int) -> bytes:
    """A stream whose middle event carries about ``size`` bytes of logprobs."""
    entries = [ENTRY] * (size // len(json.dumps(ENTRY)))
    chunks: list[dict[str, Any]] = [
        {"index": 0, "delta": {"content": "Hel"}, "finish_reason": None},
        {"index": 0, "delta": {"content": "lo"}, "logprobs": {"content": entries}, "finish_reason": None},
        {"index": 0, "delta": {"content": "!"}, "finish_reason": "stop"},
    ]
    out = [{**BASE, "choices": [choice]} for choice in chunks] + [{**BASE, "choices": [], "usage": USAGE}]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in out) + b"data: [DONE]\n\n"


class Stub:
    """Streams ``body`` (set per size) in 64 KiB writes."""

    body = b""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        body = self.body
        for start in range(0, len(body), 1 << 16):
            await send({"type": "http.response.body", "body": body[start : start + (1 << 16)], "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def cpu_s(pid: int) -> float:
    """A process's user + system CPU time so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def relay_once(port: int) -> tuple[float, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"model": "stub", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    started = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    got = len(response.read())
    conn.close()
    if response.status != 200:
        raise SystemExit(f"status {response.status}")
    return time.perf_counter() - started, got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,5,10,20,40", help="event sizes in MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",")]
    stub = Stub()
    stub_port, port = free_port(), free_port()
    server = uvicorn.Server(uvicorn.Config(stub, host="127.0.0.1", port=stub_port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    rows = []
    with tempfile.TemporaryDirectory() as data:
        limit = str(int(max(sizes) * 2 * (1 << 20)) + (1 << 20))
        sidecar = start_sidecar(port, stub_port, Path(data), DRAFTWATCH_PROXY_MAX_EVENT_BYTES=limit)
        try:
            for size in sizes:
                stub.body = events(int(size * (1 << 20)))
                walls, total = [], 0.0
                for _ in range(args.repeats):
                    before = cpu_s(sidecar.pid)
                    wall, got = relay_once(port)
                    total += cpu_s(sidecar.pid) - before
                    walls.append(wall)
                # CPU time is read in clock ticks (10 ms): summed over the repeats, not the best of them.
                mib = len(stub.body) / (1 << 20)
                rows.append((mib, sorted(walls)[len(walls) // 2], total / args.repeats, total))
                _, wall, cpu, _ = rows[-1]
                print(f"{mib:7.1f} MiB  wall {wall:7.3f} s  sidecar CPU {cpu:7.3f} s  "
                      f"{cpu / mib * 1000:6.1f} ms CPU/MiB  ({got} bytes relayed)", flush=True)  # fmt: skip
        finally:
            sidecar.terminate()
            sidecar.wait(30)
            server.should_exit = True
    # Against the smallest size whose CPU was measured over several ticks: one tick more or less is noise there.
    measured = [(mib, cpu) for mib, _, cpu, total in rows if total >= MEASURABLE_CPU_S]
    (small, small_cpu), (large, large_cpu) = measured[0], measured[-1]
    ratio = (large_cpu / large) / (small_cpu / small)
    said = f"CPU per MiB, {large:.0f} MiB event over {small:.0f} MiB: {ratio:.2f} (linear: about 1)"
    print(said)
    if not args.no_write:
        table = [
            "| event | client wall, median (s) | sidecar CPU per event (s) | CPU per MiB (ms) |",
            "|---|---|---|---|",
        ]
        table += [f"| {mib:.1f} MiB | {wall:.3f} | {cpu:.3f} | {cpu / mib * 1000:.1f} |" for mib, wall, cpu, _ in rows]
        table.append(f"\n{said}. The quadratic relay it replaces took 0.55 s of CPU for a 5 MiB event and 39.5 s "
                     "for 40 MiB (issue 49); a 20 MiB event took 16.7 s to relay in tests/proxy/test_relay_faults.py "
                     "run against it.")  # fmt: skip
        write_section("Relay cost per event size", "\n".join(table), argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
