"""Two per-request figures a cause of an acceptance drop needs: the prompt's style and how much the answer copies it.

Computed in one place for the proxy (monitor/proxy/forward/) and the embedded decoder (decoder/speculation/),
so that both paths give the same value for the same request. Neither keeps any prompt text.

* :func:`style_fingerprint`: a short hash of the request minus the user's text, so that "a new system
  prompt" is a value a drift run can group by. A chat request's template is its system and developer
  messages' text, the roles of its turns in order (the conversation's shape) and its ``tools`` and
  ``response_format``; the Responses API's ``instructions`` stand for its system message. A plain
  completion (``/v1/completions``, llama.cpp ``/completion``, SGLang ``/generate``, the decoder's plain
  string prompt) has no part that is honestly "the template" rather than the user's text: it has no
  fingerprint (``None``), never a hash of the whole prompt, which would change with every request.
* :func:`copy_share`: the share of the answer's word 4-grams that also occur in the prompt: what a
  prompt-lookup (n-gram) drafter can copy. Words, not characters: character 4-grams of any two English
  texts overlap heavily, so the share would not fall when an answer stops copying; words are split at
  punctuation too (``foo(bar)`` is four), closer to the tokens a drafter matches, and code copies are
  found. Four words is about the shortest match a prompt-lookup drafter acts on. Each text is cut to
  its first :data:`MAX_TEXT_CHARS` characters, so the cost is bounded (a few milliseconds at most).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

# Characters of each text the copy share reads; beyond, an answer's share is that of its first part.
MAX_TEXT_CHARS: Final = 64 * 1024
# Above this many characters of prompt and answer together, the proxy computes the share off its event loop.
INLINE_TEXT_CHARS: Final = 8 * 1024
NGRAM: Final = 4
STYLE_HASH_CHARS: Final = 12
# Roles whose text is the template, not the user's turn.
TEMPLATE_ROLES: Final = frozenset({"system", "developer"})
# Request members that shape every answer besides the messages (kept whole in the hash).
TEMPLATE_MEMBERS: Final = ("tools", "response_format")
_WORD: Final = re.compile(r"\w+|[^\w\s]")


def style_fingerprint(payload: Mapping[str, Any] | None) -> str | None:
    """The request's style fingerprint (:data:`STYLE_HASH_CHARS` hex characters), ``None`` for a plain prompt.

    >>> a = style_fingerprint({"messages": [{"role": "system", "content": "Be brief."},
    ...                                     {"role": "user", "content": "hi"}]})
    >>> b = style_fingerprint({"messages": [{"role": "system", "content": "Be brief."},
    ...                                     {"role": "user", "content": "something else"}]})
    >>> a == b, len(a), style_fingerprint({"prompt": "hi"})
    (True, 12, None)
    """
    if not isinstance(payload, Mapping):
        return None
    turns: list[Any] = []
    messages = payload.get("messages")
    items = payload.get("input")
    if isinstance(messages, list):
        turns = [_turn(m) for m in messages]
    elif isinstance(items, list):  # the Responses API's input items
        turns = [_turn(m) for m in items]
    elif isinstance(items, str) or "instructions" in payload:
        turns = [["user", None]]
    else:
        return None
    template = {
        "turns": turns,
        "instructions": _text(payload.get("instructions")),
        **{name: payload.get(name) for name in TEMPLATE_MEMBERS},
    }
    try:
        canonical = json.dumps(template, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    except (ValueError, RecursionError):  # a circular or absurdly nested member: no template to name
        return None
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:STYLE_HASH_CHARS]


def _turn(message: object) -> list[Any]:
    """``[role, text]`` of a template turn, ``[role, None]`` of anyone else's: their text is not the style."""
    if not isinstance(message, Mapping):
        return [type(message).__name__, None]
    role = message.get("role")
    role = role if isinstance(role, str) else str(message.get("type"))
    return [role, _text(message.get("content")) if role in TEMPLATE_ROLES else None]


def _text(content: object) -> str | None:
    """A message's text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return None


def prompt_text(payload: Mapping[str, Any] | None) -> str:
    """The text an answer could copy from: every message's, the prompt's, the instructions' (bounded).

    >>> prompt_text({"messages": [{"role": "user", "content": [{"type": "text", "text": "a b"}]}]})
    'a b'
    """
    if not isinstance(payload, Mapping):
        return ""
    pieces: list[str] = []
    for name in ("instructions", "prompt", "text", "input"):
        value = payload.get(name)
        if isinstance(value, str):
            pieces.append(value)
        elif isinstance(value, list):
            pieces.extend(p for p in value if isinstance(p, str))
            pieces.extend(t for m in value if isinstance(m, Mapping) and (t := _text(m.get("content"))))
    messages = payload.get("messages")
    if isinstance(messages, list):
        pieces.extend(t for m in messages if isinstance(m, Mapping) and (t := _text(m.get("content"))))
    return "\n".join(pieces)[:MAX_TEXT_CHARS]


def copy_share(prompt: str, answer: str) -> float | None:
    """The share of the answer's word :data:`NGRAM`-grams found in the prompt; ``None`` for an answer too short.

    >>> copy_share("the quick brown fox jumps over the lazy dog", "the quick brown fox jumps")
    1.0
    >>> copy_share("the quick brown fox jumps", "an entirely different answer here")
    0.0
    >>> copy_share("anything", "too short") is None
    True
    """
    said = _words(answer)
    if len(said) < NGRAM:
        return None
    seen = set(_grams(_words(prompt)))
    grams = _grams(said)
    return sum(gram in seen for gram in grams) / len(grams)


def _words(text: str) -> list[str]:
    return _WORD.findall(text[:MAX_TEXT_CHARS])


def _grams(words: Sequence[str]) -> list[tuple[str, ...]]:
    return list(zip(*(words[i:] for i in range(NGRAM)), strict=False))
