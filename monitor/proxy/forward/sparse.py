"""A large JSON object read for its small members, without parsing its large values, and rewritten in place.

``json.loads`` holds the GIL for a document's whole length, in a worker thread too: a 20 MiB event of
logprobs held every other request for 0.6 s, 16 bodies of 30 MiB gave others a p99 of 949 ms. What the
proxy reads of a body or an answer (the model, the stream flags, the workload's metadata, the usage and
finish reasons) is small, so a large object is walked instead: a value up to ``small`` bytes is parsed;
a larger object is walked in turn, as is a ``choices`` list (item by item); any other large value (a
prompt, the messages, logprobs) is stepped over unparsed and left out. Stepping over runs regular
expressions and byte operations on windows of :data:`WINDOW_BYTES`, each holding the GIL briefly, so that
run in a worker thread the event loop is served between them. The walk is meant for a worker thread:
it is linear in the document, but still some milliseconds a megabyte.

A body to which the proxy adds a member (``stream_options``) is rewritten by :func:`spliced`: the
member's value replaced where the client wrote it, else the member inserted before the object's end,
every other byte as sent. JSON parsers (Python's, pydantic's, which vLLM and SGLang read with) take
the last of repeated keys, so the last one is the one replaced.
"""

from __future__ import annotations

import codecs
import json
import re
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Final

# The most one regular expression or byte operation is given at once (see the module docstring).
WINDOW_BYTES: Final = 64 << 10
# Values up to this size are parsed whole (one json.loads holds the GIL that long at most).
SMALL_BYTES: Final = 64 << 10
# Lists walked item by item when large: an answer's or an event's choices carry its finish reasons.
WALKED_LISTS: Final = frozenset({"choices"})
# Where the window in which a value ends is read byte by byte rather than halved again.
_BYTE_SCAN_BYTES: Final = 1024

_WHITESPACE: Final = re.compile(rb"[ \t\n\r]*")
# A string's inside up to its closing quote (or the window's end); one escape at a time, never backtracking.
_STRING_INSIDE: Final = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)
_SCALAR: Final = re.compile(rb"[-+.0-9A-Za-z]+")
# Brackets as parentheses, which as +1 (opening) and -1 (closing, as a signed byte).
_PARENTHESES: Final = bytes.maketrans(b"[]{}", b"()()")
_STEPS: Final = bytes.maketrans(b"()", b"\x01\xff")
_REDUCTIONS: Final = 8
_NOT_MARKS: Final = bytes(b for b in range(256) if b not in b'"[]{}')
_BOM: Final = b"\xef\xbb\xbf"
_BACKSLASH, _QUOTE = ord("\\"), ord('"')
_OPENING, _CLOSING = frozenset(b"[{"), frozenset(b"]}")


@dataclass(frozen=True, slots=True)
class Sparse:
    """A JSON object as read here: its members (large values left out) and where each top-level value lies."""

    members: dict[str, Any]
    spans: dict[str, tuple[int, int]]
    closing: int  # the index of the object's closing brace
    empty: bool


def read_object(doc: bytes, small: int = SMALL_BYTES) -> Sparse | None:
    """``doc`` as one JSON object in UTF-8, its values past ``small`` bytes left out; None when it is not one."""
    start = _skip_space(doc, len(_BOM) if doc.startswith(_BOM) else 0)
    if doc[start : start + 1] != b"{" or not _utf8(doc):
        return None
    try:
        spans: dict[str, tuple[int, int]] = {}
        members, end = _walk_object(doc, start, small, spans)
    except (ValueError, RecursionError):  # malformed, truncated, or nested past what the parser goes
        return None
    if _skip_space(doc, end) != len(doc):
        return None
    return Sparse(members, spans, end - 1, empty=doc[_skip_space(doc, start + 1)] == ord("}"))


def spliced(doc: bytes, sparse: Sparse, changes: Mapping[str, Any]) -> bytes:
    """``doc`` with each of ``changes`` set as a top-level member: its value replaced, else the member added last."""
    edits: list[tuple[int, int, bytes]] = []
    added = []
    for key, value in changes.items():
        text = json.dumps(value, separators=(",", ":")).encode()
        if key in sparse.spans:
            edits.append((*sparse.spans[key], text))
        else:
            added.append(json.dumps(key).encode() + b":" + text)
    if added:
        comma = b"" if sparse.empty else b","
        edits.append((sparse.closing, sparse.closing, comma + b",".join(added)))
    view = memoryview(doc)
    pieces: list[bytes | memoryview] = []
    at = 0
    for start, end, text in sorted(edits):
        pieces += [view[at:start], text]
        at = end
    pieces.append(view[at:])
    return b"".join(pieces)


def _utf8(doc: bytes) -> bool:
    """Whether ``doc`` is valid UTF-8, checked a window at a time (a large value is never parsed, so never decoded)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        for start in range(0, len(doc), WINDOW_BYTES * 16):
            decoder.decode(doc[start : start + WINDOW_BYTES * 16])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def _skip_space(doc: bytes, at: int) -> int:
    match = _WHITESPACE.match(doc, at)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _expect(doc: bytes, at: int, char: bytes) -> int:
    if doc[at : at + 1] != char:
        raise ValueError(f"expected {char!r} at {at}")
    return at + 1


def _walk_object(
    doc: bytes, start: int, small: int, spans: dict[str, tuple[int, int]] | None = None
) -> tuple[dict[str, Any], int]:
    """The object at ``start`` (its ``{``): its members read as :func:`_read_value` reads them, and its end."""
    members: dict[str, Any] = {}
    at = _skip_space(doc, start + 1)
    if doc[at : at + 1] == b"}":
        return members, at + 1
    while True:
        key_end = _whole_string_end(doc, at)
        key = json.loads(doc[at:key_end]) if key_end - at <= small else None
        at = _skip_space(doc, _expect(doc, _skip_space(doc, key_end), b":"))
        value, end, kept = _read_value(doc, at, small, walk_list=key in WALKED_LISTS)
        if kept and isinstance(key, str):
            members[key] = value
        if spans is not None and isinstance(key, str):
            spans[key] = (at, end)
        at = _skip_space(doc, end)
        if doc[at : at + 1] == b"}":
            return members, at + 1
        at = _skip_space(doc, _expect(doc, at, b","))


def _walk_list(doc: bytes, start: int, small: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    at = _skip_space(doc, start + 1)
    if doc[at : at + 1] == b"]":
        return items, at + 1
    while True:
        value, end, kept = _read_value(doc, at, small, walk_list=False)
        if kept:
            items.append(value)
        at = _skip_space(doc, end)
        if doc[at : at + 1] == b"]":
            return items, at + 1
        at = _skip_space(doc, _expect(doc, at, b","))


def _read_value(doc: bytes, start: int, small: int, *, walk_list: bool) -> tuple[Any, int, bool]:
    """The value at ``start``, its end, and whether it was kept: parsed when small, walked or stepped over when not."""
    limit = start + small
    end = _value_end(doc, start, limit)
    if end is not None:
        return json.loads(doc[start:end]), end, True
    opening = doc[start : start + 1]
    if opening == b"{":
        members, end = _walk_object(doc, start, small)
        return members, end, True
    if opening == b"[" and walk_list:
        items, end = _walk_list(doc, start, small)
        return items, end, True
    end = _value_end(doc, start, len(doc))
    if end is None:
        raise ValueError(f"unterminated value at {start}")
    return None, end, False


def _value_end(doc: bytes, start: int, limit: int) -> int | None:
    """The end of the JSON value at ``start`` when it ends by ``limit``, else None; ValueError when it is no value."""
    opening = doc[start : start + 1]
    if opening == b'"':
        return _string_end(doc, start, limit)
    if opening in (b"{", b"["):
        return _container_end(doc, start, limit)
    match = _SCALAR.match(doc, start)
    if match is None:
        raise ValueError(f"expected a value at {start}")
    return match.end() if match.end() <= limit else None


def _whole_string_end(doc: bytes, start: int) -> int:
    end = _string_end(doc, start, len(doc))
    assert end is not None  # to the document's end: unterminated raises
    return end


def _string_end(doc: bytes, start: int, limit: int) -> int | None:
    """The end of the string at ``start`` (after its closing quote), or None when it runs past ``limit``."""
    _expect(doc, start, b'"')
    stop = min(limit, len(doc))
    at = start + 1
    while at < stop:
        end = _window_end(doc, at, stop)
        if _unescaped(doc[at:end]).find(b'"') >= 0:  # it closes in this window: found there, escape by escape
            inside = _STRING_INSIDE.match(doc, at, end)
            assert inside is not None and doc[inside.end()] == ord('"')
            return inside.end() + 1
        at = end
    if stop == len(doc):
        raise ValueError(f"unterminated string at {start}")
    return None


def _container_end(doc: bytes, start: int, limit: int) -> int | None:
    """The end of the object or array at ``start``, or None when it runs past ``limit``.

    Window by window: the strings taken out and the brackets left counted (C loops), until the depth
    could reach zero in a window, which is then halved down to a few bytes read one by one.
    """
    stop = min(limit, len(doc))
    depth, in_string, at = 1, False, start + 1
    while at < stop:
        end = _window_end(doc, at, stop)
        lowest, change, after = _balance(doc, at, end, in_string)
        if depth + lowest <= 0:
            return _end_within(doc, at, end, depth, in_string)
        depth, in_string, at = depth + change, after, end
    if stop == len(doc):
        raise ValueError(f"unterminated value at {start}")
    return None


def _window_end(doc: bytes, start: int, stop: int, size: int = WINDOW_BYTES) -> int:
    """Where a window from ``start`` ends: never inside a run of backslashes, so never inside an escape."""
    end = min(start + size, stop)
    while end < stop and doc[end - 1] == _BACKSLASH:
        end += 1
    return end


def _unescaped(piece: bytes) -> bytes:
    """``piece`` (no escape cut at either end) without its escaped backslashes and quotes: every quote left is real."""
    return piece.replace(b"\\\\", b"").replace(b'\\"', b"")


def _balance(doc: bytes, start: int, end: int, in_string: bool) -> tuple[int, int, bool]:
    """Over ``doc[start:end]``: the lowest the bracket depth goes and where it ends (relative), and whether the
    window ends inside a string."""
    piece = doc[start:end]
    if b"\\" in piece:
        piece = _unescaped(piece)
    # Quotes and brackets only, the window's open string (if any) opened again first.
    marks = (b'"' if in_string else b"") + piece.translate(None, _NOT_MARKS)
    after = marks.count(b'"') % 2 == 1
    # Two quotes side by side enclose no bracket (most strings): dropping them leaves every bracket's side as it was.
    marks = marks.replace(b'""', b"")
    if b'"' in marks:  # strings that hold brackets, or one still open: only what lies between them counted
        marks = b"".join(marks.split(b'"')[::2])
    brackets = marks.translate(_PARENTHESES)
    change = brackets.count(b"(") - brackets.count(b")")
    # A pair opened and closed side by side changes neither the lowest depth nor the last: dropped, a few
    # nesting levels at a time, the window's brackets come down to ")))(((" (closed first, then opened).
    for _ in range(_REDUCTIONS):
        reduced = brackets.replace(b"()", b"")
        if len(reduced) == len(brackets):
            return len(brackets.lstrip(b")")) - len(brackets), change, after
        brackets = reduced
    steps = array("b", brackets.translate(_STEPS))  # nested deeper than the reductions went: counted one by one
    return min(0, min(accumulate(steps), default=0)), change, after


def _end_within(doc: bytes, start: int, end: int, depth: int, in_string: bool) -> int:
    """The end of the value whose depth reaches zero within ``doc[start:end]``."""
    while end - start > _BYTE_SCAN_BYTES:
        middle = _window_end(doc, start, end, (end - start) // 2)
        lowest, change, after = _balance(doc, start, middle, in_string)
        if depth + lowest <= 0:
            end = middle
        else:
            depth, in_string, start = depth + change, after, middle
    at = start
    while at < end:
        byte = doc[at]
        if in_string:
            if byte == _BACKSLASH:
                at += 1
            elif byte == _QUOTE:
                in_string = False
        elif byte == _QUOTE:
            in_string = True
        elif byte in _OPENING:
            depth += 1
        elif byte in _CLOSING:
            depth -= 1
            if depth == 0:
                return at + 1
        at += 1
    raise AssertionError("the depth reaches zero within the window")  # pragma: no cover
