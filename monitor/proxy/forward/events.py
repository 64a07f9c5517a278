"""What a relayed answer says: where a server-sent event ends, its data, and what an event carries.

Pure functions over bytes and parsed JSON, shared by the relay (which reads each event once as it
passes), the exchange (whose decode phase is timed by the events that carry text) and the entry,
which reads a request's body and a whole answer as one JSON object too (``json_object``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

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


def carries_text(event: Mapping[str, Any]) -> bool:
    """Does a streamed event carry generated text? A role-only first chunk or ``response.created`` does not."""
    if event.get("type") == "response.output_text.delta":  # Responses
        return bool(event.get("delta"))
    choices = event.get("choices")
    if isinstance(choices, list):  # chat (delta.content, delta.reasoning_content) and completions (text)
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")):
                return True
            if choice.get("text"):
                return True
        return False
    # llama.cpp's /completion and SGLang's /generate stream the text itself.
    return bool(event.get("content") or event.get("text"))


def ends_answer(event: Mapping[str, Any] | None) -> bool:
    """The last event of a stream without ``[DONE]``: Responses' ``response.completed``, llama.cpp's ``stop``."""
    return event is not None and (event.get("type") == "response.completed" or event.get("stop") is True)


def usage_only(event: Mapping[str, Any] | None) -> bool:
    """The usage chunk asked for here (no choices): read from the event already parsed, not parsed again."""
    return event is not None and event.get("choices") == [] and "usage" in event


def event_end(buffer: bytes) -> int | None:
    """The end of the first complete event in ``buffer`` (after its blank line), or None."""
    ends = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n") if (i := buffer.find(sep)) >= 0]
    return min(ends) if ends else None


def event_data(event: bytes) -> bytes | None:
    """The joined ``data:`` lines of one event; None for comments, keep-alives and ``[DONE]``."""
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
