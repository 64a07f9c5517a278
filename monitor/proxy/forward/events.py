"""What a relayed answer says: where a server-sent event ends, its data, and what an event carries.

Functions over bytes and parsed JSON, shared by the relay (which reads each event once as it
passes), the exchange (whose decode phase is timed by the events that carry text) and the entry,
which reads a request's body and a whole answer as one JSON object too (:func:`object_of`: a large
one off the event loop, its large values unparsed, :mod:`monitor.proxy.forward.sparse`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Collection, Mapping
from typing import Any, Final

from monitor.proxy.asks import cleaned_sglang_json
from monitor.proxy.forward.sparse import SMALL_BYTES, read_object

# A JSON object in UTF-8 (RFC 8259 section 8.1), a byte order mark tolerated.
_OBJECT_START: Final = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\n\r]*\{")


def remember(
    event: dict[str, Any] | None, report: dict[str, Any] | None, finish: str | None
) -> tuple[dict[str, Any] | None, str | None]:
    if event is None:
        return report, finish
    if event.get("type") == "response.completed" and isinstance(event.get("response"), dict):
        return event["response"], finish  # a Responses stream's last event holds the whole response
    choices = event.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                finish = choice["finish_reason"]
    # The event that carries the figures: usage (OpenAI), timings (llama.cpp), meta_info (SGLang). A chunk
    # with "usage": null (vLLM writes it on every chunk but the last when usage was asked for) is not one.
    carries = any(key in event for key in ("usage", "timings", "meta_info", "metrics"))
    if carries and not ("usage" in event and event["usage"] is None):
        report = event
    return report, finish


def answer_text(answer: Mapping[str, Any]) -> str:
    """The generated text a streamed event or a whole answer carries ("" for none), reasoning included.

    Chat (``delta`` or ``message``: ``content``, ``reasoning_content``) and completions (``text``) of
    every choice, the Responses API (a delta event, or a whole response's output items), llama.cpp's
    ``/completion`` and SGLang's ``/generate`` (``content``, ``text``). A few lookups: it runs per event.
    """
    kind = answer.get("type")
    if isinstance(kind, str) and kind.startswith("response."):  # Responses: only its deltas add text
        delta = answer.get("delta") if kind == "response.output_text.delta" else None
        return delta if isinstance(delta, str) else ""
    choices = answer.get("choices")
    if isinstance(choices, list):
        pieces: list[str] = []
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            said = choice.get("delta") or choice.get("message")
            if isinstance(said, dict):
                pieces.extend(v for v in (said.get("reasoning_content"), said.get("content")) if isinstance(v, str))
            if isinstance(text := choice.get("text"), str):
                pieces.append(text)
        return "".join(pieces)
    output = answer.get("output")
    if isinstance(output, list):  # a whole Responses answer
        return "".join(
            part["text"]
            for item in output
            if isinstance(item, dict) and isinstance(item.get("content"), list)
            for part in item["content"]
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    # llama.cpp's /completion and SGLang's /generate carry the text itself.
    text = answer.get("content") or answer.get("text")
    return text if isinstance(text, str) else ""


def ends_answer(event: Mapping[str, Any] | None) -> bool:
    """The last event of a stream without ``[DONE]``: Responses' ``response.completed``, llama.cpp's ``stop``."""
    return event is not None and (event.get("type") == "response.completed" or event.get("stop") is True)


def usage_only(event: Mapping[str, Any] | None) -> bool:
    """The usage chunk asked for here (no choices): read from the event already parsed, not parsed again."""
    return event is not None and event.get("choices") == [] and "usage" in event


class EventCutter:
    """A stream's bytes cut into server-sent events as they arrive, each byte looked at once.

    The pending bytes are one ``bytearray`` (taken from the front in place), and the search for an
    event's end resumes where the last one stopped: a 20 MiB event copied and searched whole at each
    64 KiB read cost its stream 10 s of the event loop's time.
    """

    def __init__(self) -> None:
        self._pending = bytearray()
        self._resume = 0  # no event ends before this newline

    @property
    def held(self) -> int:
        """The bytes of the event not yet complete."""
        return len(self._pending)

    def feed(self, data: bytes) -> list[bytes]:
        """The events ``data`` completes, each with its blank line (``\\n\\n`` or ``\\r\\n\\r\\n``)."""
        pending = self._pending
        pending += data
        events = []
        start, at = 0, self._resume
        while True:
            newline = pending.find(b"\n", at)
            if newline < 0:
                resume = len(pending)
                break
            if newline + 1 == len(pending) or (newline + 2 == len(pending) and pending[newline + 1] == 0x0D):
                resume = newline  # which line ends here is told by bytes still to come
                break
            if pending[newline + 1] == 0x0A:  # \n\n
                end = newline + 2
            elif pending[newline - 1 : newline] == b"\r" and pending[newline + 1 : newline + 3] == b"\r\n":
                end = newline + 3
            else:
                at = newline + 1
                continue
            events.append(bytes(pending[start:end]))
            start = at = end
        del pending[:start]
        self._resume = resume - start
        return events

    def rest(self) -> bytes:
        """The bytes held (a stream's tail without a blank line), taken."""
        rest = bytes(self._pending)
        self._pending.clear()
        self._resume = 0
        return rest


def event_data(event: bytes) -> bytes | None:
    """The joined ``data:`` lines of one event; None for comments, keep-alives and ``[DONE]``."""
    first_end = event.find(b"\n")
    if event.startswith(b"data:") and not event[first_end:].strip() and b"\r" not in event[:first_end]:
        # One data line (what engines send): one copy of it, where a large event's lines cost three.
        data = event[5:first_end].lstrip()
        return None if data.strip() == b"[DONE]" else data
    lines = [line[5:].lstrip() for line in event.splitlines() if line.startswith(b"data:")]
    data = b"\n".join(lines)
    return None if not lines or data.strip() == b"[DONE]" else data


def is_done(event: bytes) -> bool:
    return any(line.startswith(b"data:") and line[5:].strip() == b"[DONE]" for line in event.splitlines())


def json_object(content: bytes) -> dict[str, Any] | None:
    # Anything else (an upload, a JSON array) is no object, told without decoding it: a large body that
    # failed as UTF-8 was copied whole into the error, holding the event loop.
    if not _OBJECT_START.match(content):
        return None
    try:
        value = json.loads(content)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes, read as no JSON
        return None
    return value if isinstance(value, dict) else None


def object_in(content: bytes) -> dict[str, Any] | None:
    """:func:`json_object`; past :data:`SMALL_BYTES`, with its large values left out (for a worker thread)."""
    if len(content) <= SMALL_BYTES:
        return json_object(content)
    read = read_object(content)
    return None if read is None else read.members


async def object_of(content: bytes) -> dict[str, Any] | None:
    """:func:`object_in`, in a worker thread past :data:`SMALL_BYTES` (on the event loop, no thread hop, below)."""
    if len(content) <= SMALL_BYTES:
        return json_object(content)
    return await asyncio.to_thread(object_in, content)


async def cleaned_sglang_of(content: bytes, added: Collection[str]) -> bytes | None:
    """:func:`~monitor.proxy.asks.cleaned_sglang_json` of an event or a whole answer, a large one in a worker thread.

    Its parse there still holds the GIL for the content's length: SGLang's added details come on an
    event of their own, and ``meta_info`` is asked for a whole answer only, so this is rare.
    """
    if len(content) <= SMALL_BYTES:
        return cleaned_sglang_json(content, added)
    return await asyncio.to_thread(cleaned_sglang_json, content, added)
