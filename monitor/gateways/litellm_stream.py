"""A streamed answer through LiteLLM, watched chunk by chunk and reported as the sidecar's proxy records a stream.

The chunks are the engine's own, as they came off the wire, before LiteLLM rebuilds them (it drops
an engine's fields from a chunk without choices: vLLM's ``metrics`` and llama.cpp's ``timings`` on
the final usage chunk). Each chunk's arrival is timed: the first one is the time to the first token,
the first and last that carry text bound the decode phase. The report is the last chunk that carries
the engine's figures (usage, ``timings``, ``metrics``), with the finish reason of the chunk that said
it where that chunk has no choices; a stream that ended without a finish reason, failed or was left
by its client is an error record, as the proxy makes one. No LiteLLM import.

>>> watch = StreamWatch(started=100.0, t0=0.0)
>>> base = {"id": "c1", "model": "m", "object": "chat.completion.chunk"}
>>> for t, chunk in [(0.2, {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
...                  (0.3, {**base, "choices": [{"index": 0, "delta": {"content": "secret"}}]}),
...                  (0.5, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
...                  (0.6, {**base, "choices": [], "usage": {"completion_tokens": 2}, "metrics": {"x": 1}})]:
...     watch.saw(chunk, t)
>>> body = watch.report(workload="chat", mode="speculative", drafter="upstream", ended_t=0.7)
>>> body["choices"], body["usage"], body["metrics"], body["ttft_ms"], round(body["decode_ms"], 6)
([{'index': 0, 'finish_reason': 'length'}], {'completion_tokens': 2}, {'x': 1}, 200.0, 0.0)
>>> body["ts_start"], body["ts_end"]
('1970-01-01T00:01:40+00:00', '1970-01-01T00:01:40.700000+00:00')
>>> "secret" in str(body)
False
>>> StreamWatch(started=100.0, t0=0.0).finished
False
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from decoder.record import Mode
from monitor.gateways.litellm_report import report_body

# The top-level fields an engine reports its figures in: OpenAI's usage, llama.cpp's, vLLM's and SGLang's own.
_FIGURES: Final = ("usage", "timings", "metrics", "meta_info")
# What a streamed choice's delta carries text (or a tool call) in.
_TEXT_OF_DELTA: Final = ("content", "reasoning_content", "reasoning", "tool_calls", "function_call")


def field(chunk: Any, name: str) -> Any:
    """A chunk's field, whether the chunk is a mapping or an object (the OpenAI client's, its extras included)."""
    return chunk.get(name) if isinstance(chunk, Mapping) else getattr(chunk, name, None)


def as_dict(chunk: Any) -> dict[str, Any]:
    """The chunk as the engine sent it, without the fields a client library filled in as null."""
    dumped = chunk.model_dump() if hasattr(chunk, "model_dump") else chunk
    return {k: v for k, v in dumped.items() if v is not None} if isinstance(dumped, Mapping) else {}


class StreamWatch:
    """What a stream showed: when its chunks came, the chunk with the engine's figures, how it finished.

    ``started`` is the request's start (epoch seconds), ``t0`` the same moment on the clock the chunks
    are timed on (``time.perf_counter``).
    """

    def __init__(self, started: float, t0: float) -> None:
        self.started = started
        self.t0 = t0
        self.first_s: float | None = None
        self.first_text_s: float | None = None
        self.last_text_s: float | None = None
        self.figures: Any = None
        self.finish_reason: str | None = None
        self.request_id: str | None = None
        self.model: str | None = None
        self.last: Any = None
        # Whether the engine's own chunks are seen (:meth:`saw_raw`): then only they give the figures.
        self.tapped = False

    def saw_raw(self, chunk: Any) -> None:
        """One chunk as the engine sent it, before LiteLLM rebuilt it: where the engine's figures are kept."""
        self.tapped = True
        if any(field(chunk, name) is not None for name in _FIGURES):
            self.figures = chunk

    def saw(self, chunk: Any, now: float) -> None:
        """One chunk of the stream, passed on at ``now`` (the ``t0`` clock); cheap: no copy, no dump."""
        at = now - self.t0
        if self.first_s is None:
            self.first_s = at
        self.last = chunk
        self.request_id = self.request_id or _text_or_none(field(chunk, "id"))
        self.model = self.model or _text_or_none(field(chunk, "model"))
        for choice in field(chunk, "choices") or ():
            delta = field(choice, "delta")
            if (delta is not None and any(field(delta, name) for name in _TEXT_OF_DELTA)) or field(choice, "text"):
                if self.first_text_s is None:
                    self.first_text_s = at
                self.last_text_s = at
            reason = field(choice, "finish_reason")
            if reason:
                self.finish_reason = str(reason)
        if not self.tapped and any(field(chunk, name) is not None for name in _FIGURES):
            self.figures = chunk

    @property
    def finished(self) -> bool:
        """Whether the stream said how it ended: a chunk carried a finish reason."""
        return self.finish_reason is not None

    def report(self, *, workload: str, mode: Mode, drafter: str | None, ended_t: float) -> dict[str, Any]:
        """The adapter's body: the chunk with the figures (else the last), the gateway's clock and timings."""
        response = as_dict(self.figures if self.figures is not None else self.last)
        choices = response.get("choices")
        if not choices and self.finish_reason is not None:
            # A final usage chunk has no choices: the finish reason of the chunk that said it, as the stack wrote it.
            response["choices"] = [{"index": 0, "finish_reason": self.finish_reason}]
        body = report_body(response, workload=workload, mode=mode, drafter=drafter,
                           started=self.started, ended=self.started + ended_t - self.t0)  # fmt: skip
        if self.first_s is not None:
            body["ttft_ms"] = self.first_s * 1000
        if self.first_text_s is not None and self.last_text_s is not None:
            body["decode_ms"] = (self.last_text_s - self.first_text_s) * 1000
        return body

    def failure(
        self, *, workload: str, mode: Mode, drafter: str | None, ended_t: float, stack: str, model: str, error: str
    ) -> dict[str, Any]:
        """A record for ``POST /v1/events``: the stream failed or was left before its end, as the proxy records it."""
        ended = self.started + ended_t - self.t0
        return {
            "request_id": self.request_id or f"litellm-{uuid.uuid4().hex}",
            "ts_start": datetime.fromtimestamp(self.started, UTC).isoformat(),
            "ts_end": datetime.fromtimestamp(ended, UTC).isoformat(),
            "workload": workload,
            "target_model": self.model or model,
            "drafter": drafter or "unknown",
            "mode": mode,
            "finish_reason": "error",
            "error": error[:200],
            "ttft_ms": None if self.first_s is None else self.first_s * 1000,
            "latency_ms": max(ended - self.started, 0.0) * 1000,
            "source": f"proxy:{stack}",
        }


class Tapped:
    """An engine's chunk stream that hands each chunk to ``saw`` as it passes.

    Everything else is the stream's own (its ``response``, ``aclose``), so that whoever reads it and closes it
    does so as before.
    """

    def __init__(self, stream: Any, saw: Callable[[Any], None]) -> None:
        self._stream = stream
        self._iterator: AsyncIterator[Any] = stream.__aiter__()
        self._saw = saw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __aiter__(self) -> Tapped:
        return self

    async def __anext__(self) -> Any:
        chunk = await self._iterator.__anext__()
        with contextlib.suppress(Exception):  # never the stream's failure
            self._saw(chunk)
        return chunk


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
