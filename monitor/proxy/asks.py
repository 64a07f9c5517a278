"""What the proxy adds to an SGLang request so that its answer carries the speculative counts, and takes out again.

SGLang's OpenAI-compatible routes report per-request counts only when asked (the shapes are in
:mod:`monitor.ingest.stacks.sglang`'s docstring): ``return_meta_info`` on a non-streamed chat (a
streamed chat answers it with a 400, and ``/v1/completions`` has no such flag), and
``return_spec_tokens_details`` where the build carries it (ignored where not: SGLang's request
models drop unknown fields). :func:`ask_sglang` adds what the client did not ask for itself and
says what it added; :func:`cleaned_sglang` takes exactly that out of the answer, so that the
client reads what it would have read without the proxy. All functions here are pure.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, Final

ASKED_PATHS: Final = ("/v1/chat/completions", "/v1/completions")
META_INFO: Final = "return_meta_info"
SPEC_DETAILS: Final = "return_spec_tokens_details"


def ask_sglang(payload: dict[str, Any], path: str) -> frozenset[str]:
    """Set in ``payload`` the flags SGLang needs to report the counts; the names of those it set."""
    if path not in ASKED_PATHS:
        return frozenset()
    wanted = [SPEC_DETAILS]
    if path == "/v1/chat/completions" and payload.get("stream") is not True:
        wanted.append(META_INFO)
    added = frozenset(name for name in wanted if payload.get(name) is not True)
    payload.update(dict.fromkeys(added, True))
    return added


def cleaned_sglang(answer: Mapping[str, Any], added: Collection[str]) -> dict[str, Any] | None:
    """``answer`` (a body or one streamed event) without what ``added`` made SGLang write.

    ``None`` for a streamed event that only carried what was added (SGLang sends the details on an
    event of their own, which the client would not have received).
    """
    out = dict(answer)
    choices = out.get("choices")
    if META_INFO in added and isinstance(choices, list):
        out["choices"] = [
            {k: v for k, v in c.items() if k != "meta_info"} if isinstance(c, dict) else c for c in choices
        ]
    ext = out.get("sglext")
    if SPEC_DETAILS in added and isinstance(ext, dict) and "spec_tokens_details" in ext:
        rest = {k: v for k, v in ext.items() if k != "spec_tokens_details"}
        if rest:
            out["sglext"] = rest
        else:
            del out["sglext"]  # SGLang leaves sglext out when it has nothing in it
            if out.get("choices") == [] and out.get("usage") is None:
                return None
    return out


def cleaned_sglang_json(content: bytes, added: Collection[str]) -> bytes | None:
    """:func:`cleaned_sglang` on JSON bytes: ``content`` itself when nothing is taken out, else re-serialized.

    SGLang writes compact JSON (orjson for a body, pydantic for an event), so the re-serialized text
    is what it would have written without the added fields.
    """
    if not added:
        return content
    try:
        answer = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        return content
    if not isinstance(answer, dict):
        return content
    cleaned = cleaned_sglang(answer, added)
    if cleaned is None:
        return None
    if cleaned == answer:
        return content
    return json.dumps(cleaned, ensure_ascii=False, separators=(",", ":")).encode()


def gathered_sglang(report: dict[str, Any] | None, event: Mapping[str, Any]) -> dict[str, Any] | None:
    """The report of an SGLang stream so far, with ``event`` added: its counts and its usage ride separate events.

    Keeps the id and model, the last usage, each choice's finish reason (and ``meta_info``, where a
    build streams it) and ``sglext.spec_tokens_details``; ``None`` until an event carries a figure.
    """
    gathered = dict(report) if report is not None else {}
    for key in ("id", "model"):
        if isinstance(event.get(key), str):
            gathered[key] = event[key]
    carries = False
    if isinstance(event.get("usage"), dict):
        gathered["usage"], carries = event["usage"], True
    ext = event.get("sglext")
    if isinstance(ext, dict) and "spec_tokens_details" in ext:
        gathered["sglext"], carries = {"spec_tokens_details": ext["spec_tokens_details"]}, True
    choices = {c.get("index", 0): dict(c) for c in gathered.get("choices", [])}
    for choice in event.get("choices") or []:
        if not isinstance(choice, dict) or not isinstance(choice.get("index", 0), int):
            continue
        kept = choices.setdefault(choice.get("index", 0), {"index": choice.get("index", 0)})
        if isinstance(choice.get("finish_reason"), str):
            kept["finish_reason"] = choice["finish_reason"]
        if isinstance(choice.get("meta_info"), dict):
            kept["meta_info"], carries = choice["meta_info"], True
    if choices:
        gathered["choices"] = [choices[i] for i in sorted(choices)]
    if report is None and not carries:
        return None
    return gathered
