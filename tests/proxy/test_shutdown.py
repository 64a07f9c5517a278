"""SIGTERM with a stream open: the server drains, stops within its limit and records the stream it cut (issue 49).

uvicorn waited for a never-ending stream forever, refusing every new connection meanwhile, and the
pod's SIGKILL lost the stream's record. Now (monitor/api/server.py) requests are still served for
api.drain_delay_s while /readyz answers 503, the streams open run on for api.shutdown_timeout_s,
then they are ended and recorded, and the process exits. A real ``draftwatch serve`` process in
front of a stand-in engine whose stream does not end.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx

from tests.proxy.engine import Engine, rows
from tests.serving import free_port, serve_process, serving

DRAIN_S = 1.5
LIMIT_S = 2.0
MARGIN_S = 3.0  # the lifespan's end (the recorder's last write) and the interpreter's exit
ASK = {"model": "qwen-coder", "messages": [{"role": "user", "content": "hi"}]}


def test_sigterm_drains_then_ends_a_never_ending_stream_within_its_limit_and_records_it(tmp_path: Path) -> None:
    engine = Engine()
    engine.event_pause_s = 3600  # the stream's first event, then nothing: it never ends by itself
    db_url = f"sqlite:///{tmp_path / 'proxy.db'}"
    env = {"DRAFTWATCH_API_DRAIN_DELAY_S": str(DRAIN_S), "DRAFTWATCH_API_SHUTDOWN_TIMEOUT_S": str(LIMIT_S)}
    events: list[str] = []
    first = threading.Event()
    cut: list[float] = []
    with serving(engine.app(), log_level="warning") as upstream:
        port = free_port()
        process = serve_process(tmp_path, db_url, port, DRAFTWATCH_PROXY_UPSTREAM=upstream, **env)
        url = f"http://127.0.0.1:{port}"
        try:

            def stream() -> None:
                body = {**ASK, "stream": True}
                try:
                    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body,
                                      headers={"X-Workload": "streaming"}, timeout=30) as response:  # fmt: skip
                        for line in response.iter_lines():
                            events.append(line)
                            first.set()
                except httpx.HTTPError:
                    pass  # cut by the shutdown, as it should be
                cut.append(time.monotonic())

            reader = threading.Thread(target=stream)
            reader.start()
            assert first.wait(30), "the stream never started"
            signalled = time.monotonic()  # before the signal: the server's own clock starts after it
            process.send_signal(signal.SIGTERM)
            # The drain: out of the load balancer, still serving.
            ready = httpx.get(f"{url}/readyz", timeout=5)
            answered = httpx.post(f"{url}/v1/chat/completions", json=ASK, headers={"X-Workload": "draining"},
                                  timeout=5)  # fmt: skip
            drained_s = time.monotonic() - signalled
            code = process.wait(DRAIN_S + LIMIT_S + MARGIN_S)
            exited_s = time.monotonic() - signalled
            reader.join(5)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        output = process.stdout.read().decode() if process.stdout else ""
    assert drained_s < DRAIN_S, "the drain's requests took longer than the drain"
    assert ready.status_code == 503 and ready.json()["checks"]["shutdown"] == {"ok": False, "draining": True}
    assert answered.status_code == 200 and answered.headers["connection"] == "close"
    assert code == 0, output
    # The stream ran through the drain and the limit, and was cut then; the process exited soon after.
    assert DRAIN_S + LIMIT_S <= cut[0] - signalled <= exited_s < DRAIN_S + LIMIT_S + MARGIN_S
    assert events and events[0].startswith("data: ")
    assert "Traceback" not in output
    recorded = {row["workload"]: row for row in rows(db_url)}
    assert recorded.keys() == {"streaming", "draining"}
    assert recorded["draining"]["error"] is None
    cut = recorded["streaming"]
    assert cut["finish_reason"] == "error" and cut["error"] == "server shutting down"
