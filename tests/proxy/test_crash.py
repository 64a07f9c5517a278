"""kill -9 of a real proxy sidecar right after its answers: what survives, with and without spool_before_reply.

The flush interval is 30 s here, so that the queue's records are still in memory at the kill
whatever the machine's speed: without the setting they are lost (the documented bound: the records
of the last flush interval), with it every answered request is on disk before its last byte left,
and is stored once after the restart. What is asserted holds for any timing.

A stream without ``[DONE]`` (Responses) ends its answer with an event a client may stop reading at:
the record is on disk before that event is passed on, not only before the body's end.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import httpx

from tests.ingest.test_recorder_durable import spooled_ids
from tests.proxy.engine import rows, sidecar
from tests.proxy.upstream import Upstream, serving
from tests.serving import free_port, serve_process

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def answer_then_kill(tmp_path: Path, db_url: str, upstream: str, spool_before_reply: bool) -> None:
    """One whole and one streamed answer, read to their last byte, then kill -9 at once."""
    port = free_port()
    sidecar = serve_process(
        tmp_path,
        db_url,
        port,
        DRAFTWATCH_PROXY_UPSTREAM=upstream,
        DRAFTWATCH_RECORDER_FLUSH_INTERVAL_S="30",
        DRAFTWATCH_RECORDER_SPOOL_BEFORE_REPLY=str(spool_before_reply).lower(),
    )
    prefix = "on" if spool_before_reply else "off"
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            whole = client.post("/v1/chat/completions", json=CHAT, headers={"X-Workload": f"{prefix}-whole"})
            assert whole.status_code == 200 and whole.json()["choices"]
            stream = {**CHAT, "stream": True}
            with client.stream(
                "POST", "/v1/chat/completions", json=stream, headers={"X-Workload": f"{prefix}-stream"}
            ) as streamed:
                body = b"".join(streamed.iter_bytes())
            assert streamed.status_code == 200 and body.endswith(b"data: [DONE]\n\n")
    finally:
        sidecar.send_signal(signal.SIGKILL)
        sidecar.wait(10)


def test_a_kill_right_after_the_answer_keeps_its_record_only_with_spool_before_reply(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'draftwatch.db'}"
    with serving(Upstream()) as upstream:
        answer_then_kill(tmp_path, db_url, upstream, spool_before_reply=False)
        answer_then_kill(tmp_path, db_url, upstream, spool_before_reply=True)
    # The restart claims the spool the dead process left; its clean stop replays it.
    restarted = serve_process(tmp_path, db_url, free_port())
    restarted.send_signal(signal.SIGTERM)
    restarted.wait(30)

    stored = Counter(row["workload"] for row in rows(db_url))
    # Off: the answered requests' records were in memory, within the flush interval, and died with it.
    assert stored["off-whole"] == stored["off-stream"] == 0
    # On: both were fsync'd before the client's last byte, and are stored once.
    assert stored["on-whole"] == stored["on-stream"] == 1


def test_a_responses_stream_is_on_disk_before_its_completed_event_reaches_the_client(tmp_path: Path) -> None:
    upstream = Upstream()
    upstream.stream_pause_s = 2.0  # the upstream holds the stream open after response.completed
    settings = {"DRAFTWATCH_RECORDER_SPOOL_BEFORE_REPLY": "true", "DRAFTWATCH_RECORDER_FLUSH_INTERVAL_S": "30"}
    with (
        serving(upstream) as upstream_url,
        sidecar(tmp_path, f"sqlite:///{tmp_path / 'draftwatch.db'}", upstream_url, **settings) as (url, _),
        httpx.stream("POST", f"{url}/v1/responses", json={"model": "m", "input": "hi", "stream": True}) as streamed,
    ):
        for line in streamed.iter_lines():
            if line.startswith("data:") and "response.completed" in line:
                break
        # The stream is still open, and the writer (30 s flush interval) has not run: the spool holds it.
        assert spooled_ids(tmp_path / "data" / "spool") == [upstream.responses["id"]]
