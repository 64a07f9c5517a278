"""A request's row of the prompt sample (:mod:`monitor.ingest.capture`): its prompt and sampling settings.

Only what the sidecar sees whole is taken: a proxied ``/v1/chat/completions`` (its ``messages``,
each a text or text parts) or ``/v1/completions`` (one text ``prompt``), and the embedded decoder's
``/v1/generate`` and ``/v1/chat/completions``. A proxied request with anything else (images, tool
calls, a batch of prompts, token ids) is not captured: replayed without it, it would be another prompt.
Nothing here runs unless capture is on and the request passed its gate (the API's
:func:`monitor.api.state.offer` calls it). Pure functions of the request: the proxy and the
decoder's routes share them without reaching into each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from decoder.evaluation import SampleRow

OPENAI_DEFAULT_TEMPERATURE = 1.0


def decoded_row(prompt: str | list[dict[str, str]], options: Mapping[str, Any]) -> SampleRow:
    """The row of an embedded-decoder request: its prompt and the options the decoder was given."""
    return SampleRow(
        workload=options["workload"],
        prompt=prompt,
        chat=bool(options.get("chat", True)),
        temperature=options["temperature"],
        top_p=options["top_p"],
        max_new_tokens=options["max_new_tokens"],
    )


def proxied_row(path: str, payload: Mapping[str, Any] | None, workload: str) -> SampleRow | None:
    """The row of a proxied OpenAI-compatible request, or None when its prompt is not plain text."""
    if payload is None:
        return None
    prompt: str | list[dict[str, str]] | None
    if path == "/v1/chat/completions":
        prompt = _messages(payload.get("messages"))
    elif path == "/v1/completions":
        prompt = payload.get("prompt") if isinstance(payload.get("prompt"), str) else None
    else:
        return None
    if not prompt:
        return None
    # An OpenAI-compatible server samples at temperature 1 unless told otherwise; replayed greedily,
    # such a prompt would be measured in another regime than the traffic it came from.
    settings: dict[str, Any] = {"temperature": OPENAI_DEFAULT_TEMPERATURE}
    for key in ("temperature", "top_p"):
        if _is_number(payload.get(key)):
            settings[key] = float(payload[key])
    tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        settings["max_new_tokens"] = tokens
    return SampleRow(workload=workload, prompt=prompt, chat=path == "/v1/chat/completions", **settings)


def _messages(raw: Any) -> list[dict[str, str]] | None:
    if not isinstance(raw, list) or not raw:
        return None
    messages = []
    for message in raw:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return None
        content = _text(message.get("content"))
        if content is None or message.get("tool_calls"):
            return None
        messages.append({"role": message["role"], "content": content})
    return messages


def _text(content: Any) -> str | None:
    """A message's content as text: a string, or text parts joined; None for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = [p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) == len(content) and all(isinstance(text, str) for text in texts):
            return "".join(texts)
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
