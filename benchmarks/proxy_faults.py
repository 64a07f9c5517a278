"""What one hostile answer, body or client costs everyone else: a victim's latency through the sidecar under each fault.

    python -m benchmarks.proxy_faults [--seconds 8] [--no-write]

Three kinds of process on loopback: a stub upstream (uvicorn), ``draftwatch serve --upstream`` on a SQLite
file, as deployed, and the clients. The victim is a process of its own sending one small chat request
after another for the whole run (its latencies are what is reported); the faults are made by this one,
one after the other, each while the victim runs:

- none: the victim alone, the truth the others are read against;
- a streamed answer with one 20 MiB server-sent event (a long prompt's logprobs), read whole by its client;
- 16 concurrent 30 MiB request bodies, half of them streamed (the proxy adds ``stream_options``);
- a 512 MiB answer on a pass-through route (``GET /v1/big``), read whole by its client;
- 500 connections trickling their request head, a byte a second.

Per fault: the victim's p50 / p99 / max, how long the fault's own requests took and what they were
answered, and the sidecar's peak resident memory. Figures go into RESULTS.md unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.http_ingest import free_port
from benchmarks.proxy_overhead import BODY, pct, rss_mb, start_sidecar, start_stub
from benchmarks.results import write_section

BIG_EVENT_BYTES = 20 << 20
BIG_BODY_BYTES = 30 << 20
BIG_BODIES = 16
BIG_ANSWER_BYTES = 512 << 20
TRICKLERS = 500

STUB = """
import itertools, json, sys
import uvicorn
CHAT = json.loads(sys.argv[2])
NUMBERS = itertools.count()

async def drained(receive):
    raw = bytearray()
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if not message.get("more_body"):
            return bytes(raw)

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    raw = await drained(receive)
    if scope["path"] == "/v1/big":
        size = int(scope["query_string"].decode().partition("=")[2])
        headers = [(b"content-type", b"application/json"), (b"content-length", str(size).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        piece = b" " * (1 << 20)
        for _ in range(size >> 20):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    # A large body is not parsed here: the stub's own parse is not what is measured.
    request = json.loads(raw) if len(raw) < 1 << 20 else {}
    answer = f"chatcmpl-{next(NUMBERS)}"
    if not request.get("big_event"):
        body = json.dumps({**CHAT, "id": answer}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    base = {"id": answer, "object": "chat.completion.chunk", "model": CHAT["model"]}
    for content in ("x", "x" * int(request["big_event"]), "x"):
        chunk = {**base, "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}
        event = f"data: {json.dumps(chunk)}\\n\\n".encode()
        await send({"type": "http.response.body", "body": event, "more_body": True})
    usage = {**base, "choices": [], "usage": CHAT["usage"], "metrics": CHAT["metrics"]}
    await send({"type": "http.response.body", "body": f"data: {json.dumps(usage)}\\n\\ndata: [DONE]\\n\\n".encode()})

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


def victim(port: int, seconds: float) -> None:
    """Small chat requests one after another for ``seconds``; prints their latencies (ms) as one JSON list."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    timings = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", BODY, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        timings.append((time.perf_counter() - t0) * 1000)
    print(json.dumps(timings))


def ask(port: int, method: str, target: str, body: bytes = b"") -> tuple[int, int]:
    """One request; its status and the answer's length in bytes (read whole)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request(method, target, body or None, {"Content-Type": "application/json"})
        response = conn.getresponse()
        size = 0
        while piece := response.read(1 << 20):
            size += len(piece)
        return response.status, size
    finally:
        conn.close()


def big_event(port: int) -> str:
    body = json.dumps({"model": "m", "stream": True, "big_event": BIG_EVENT_BYTES, "messages": []}).encode()
    status, size = ask(port, "POST", "/v1/chat/completions", body)
    return f"{status}, {size / 2**20:.1f} MiB relayed"


def big_bodies(port: int) -> str:
    filler = "y" * BIG_BODY_BYTES
    bodies = [
        json.dumps({"model": "m", "stream": n % 2 == 1, "messages": [{"role": "user", "content": filler}]}).encode()
        for n in range(BIG_BODIES)
    ]
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda b=b: statuses.append(ask(port, "POST", "/v1/chat/completions", b)[0]))
               for b in bodies]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ", ".join(f"{statuses.count(s)} x {s}" for s in sorted(set(statuses)))


def big_answer(port: int) -> str:
    status, size = ask(port, "GET", f"/v1/big?bytes={BIG_ANSWER_BYTES}")
    return f"{status}, {size / 2**20:.0f} MiB passed"


def tricklers(port: int) -> str:
    """Connections that send their head a byte a second until cut; how many the sidecar cut, and after how long."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + b"x-pad: " + b"a" * 64
    sockets = []
    for _ in range(TRICKLERS):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        sockets.append(sock)
    started = time.monotonic()
    cut: dict[int, float] = {}
    for offset in range(len(head)):
        for number, sock in enumerate(sockets):
            if number in cut:
                continue
            try:
                sock.send(head[offset : offset + 1])
                if sock.recv(4096, socket.MSG_PEEK) is not None:
                    cut[number] = time.monotonic() - started
            except BlockingIOError:
                pass
            except OSError:
                cut[number] = time.monotonic() - started
        if len(cut) == len(sockets) or time.monotonic() - started > 60:
            break
        time.sleep(1)
    for sock in sockets:
        sock.close()
    if not cut:
        return f"0 of {TRICKLERS} cut in {time.monotonic() - started:.0f} s"
    return f"{len(cut)} of {TRICKLERS} cut, the last after {max(cut.values()):.0f} s"


FAULTS: dict[str, Callable[[int], str]] = {
    "none": lambda port: "",
    f"one {BIG_EVENT_BYTES >> 20} MiB event": big_event,
    f"{BIG_BODIES} x {BIG_BODY_BYTES >> 20} MiB bodies": big_bodies,
    f"a {BIG_ANSWER_BYTES >> 20} MiB pass-through answer": big_answer,
    f"{TRICKLERS} trickled heads": tricklers,
}


def run_fault(
    port: int, pid: int, seconds: float, fault: Callable[[int], str]
) -> tuple[list[float], str, float, float]:
    """The victim's latencies while ``fault`` runs, its outcome, how long it took, and the sidecar's peak RSS (MB)."""
    watcher = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.proxy_faults", "--victim", str(port), "--seconds", str(seconds)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
    )
    peak = rss_mb(pid)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mb(pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    time.sleep(0.5)  # the victim has started
    t0 = time.monotonic()
    outcome = fault(port)
    took = time.monotonic() - t0
    out, _ = watcher.communicate()
    done.set()
    sampler.join()
    return json.loads(out), outcome, took, peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="the victim's run per fault (default 8)")
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS.md")
    parser.add_argument("--victim", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.victim is not None:
        victim(args.victim, args.seconds)
        return 0
    upstream_port, proxy_port = free_port(), free_port()
    lines = [
        "| fault | victim p50 / p99 / max (ms) | victim requests | the fault's outcome | its time (s) | "
        "sidecar peak RSS (MB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        stub = start_stub(upstream_port, STUB)
        sidecar = start_sidecar(proxy_port, upstream_port, Path(tmp))
        try:
            for name, fault in FAULTS.items():
                timings, outcome, took, peak = run_fault(proxy_port, sidecar.pid, args.seconds, fault)
                line = (f"| {name} | {pct(timings, 50):.2f} / {pct(timings, 99):.2f} / {max(timings):.1f} | "
                        f"{len(timings):,} | {outcome or '-'} | {took:.2f} | {peak:.0f} |")  # fmt: skip
                print(line, flush=True)
                lines.append(line)
        finally:
            sidecar.terminate()
            stub.terminate()
            sidecar.wait(60)
            stub.wait(30)
    body = "\n".join(
        [
            "`draftwatch serve --upstream` (SQLite, recording every request, the scheduler in its process) in front "
            "of a stub upstream; a victim process sends small chat requests one after another through the sidecar "
            f"for {args.seconds:g} s per row while this process makes the row's fault.",
            "",
            *lines,
        ]
    )
    print(body)
    if not args.no_write:
        write_section("Proxy faults: what one request costs the others", body,
                      ["benchmarks/proxy_faults.py", *(argv or sys.argv[1:])])  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
