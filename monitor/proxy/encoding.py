"""Content codings in proxy mode: bodies pass compressed, the record reads a decoded copy.

The client's ``Accept-Encoding`` goes upstream limited to the codings read here (gzip, deflate), so
that whatever the upstream compresses can still be recorded; a compressed answer reaches the client
as it came, with its ``Content-Encoding``. A stream is the exception: its events are read (and the
usage chunk the client did not ask for is taken out) one by one, so it is decoded here and relayed
as identity, which every client accepts. Decoding is bounded: it stops as soon as the output would
pass the limit, so that a small body that inflates a thousandfold (a decompression bomb) is never
inflated whole; such an answer reads as no body at all, such a request is refused (:func:`bounded`).
"""

from __future__ import annotations

import zlib
from typing import Final

# Codings this module decodes; an upstream may be asked for these and nothing else.
DECODABLE: Final = frozenset({"gzip", "x-gzip", "deflate"})
# The most asked of zlib at once (see _inflate).
PIECE_BYTES: Final = 8 << 20


class TooLargeError(zlib.error):
    """The decoded body would exceed the limit; decoding stopped there."""


def accepted_upstream(accept_encoding: str) -> str:
    """The client's ``Accept-Encoding`` without the codings the record could not read.

    >>> accepted_upstream("gzip, deflate, br, zstd")
    'gzip, deflate'
    >>> accepted_upstream("br")
    'identity'
    """
    kept = []
    for item in accept_encoding.split(","):
        coding = item.split(";", 1)[0].strip().lower()
        if coding in DECODABLE or coding == "identity":
            kept.append(item.strip())
    return ", ".join(kept) or "identity"


def codings(content_encoding: str) -> list[str] | None:
    """The codings applied, first to last; None when one of them cannot be decoded here.

    >>> codings("gzip"), codings(""), codings("identity, gzip"), codings("br")
    (['gzip'], [], ['gzip'], None)
    """
    applied = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    applied = [c for c in applied if c != "identity"]
    return applied if all(c in DECODABLE for c in applied) else None


class Decoder:
    """Decodes a body as it arrives, through each coding in turn; at most ``limit`` bytes come out."""

    def __init__(self, applied: list[str], limit: int) -> None:
        # The last coding applied is the first undone. wbits 47 reads a zlib or a gzip header: servers
        # send either for "deflate" (RFC 9110 says zlib; some send raw deflate, tried when the header fails).
        self._stages = [zlib.decompressobj(47) for _ in reversed(applied)]
        # Per stage, under "deflate": its input until the header was read, to start again raw.
        self._held: list[bytearray | None] = [bytearray() if c == "deflate" else None for c in reversed(applied)]
        self._limit = limit
        self._out = 0

    def feed(self, chunk: bytes) -> bytes:
        """The decoded bytes of ``chunk``; :class:`zlib.error` when the body is not what it says,
        :class:`TooLargeError` when it is too large.
        """
        room = self._limit - self._out + 1
        for number, stage in enumerate(self._stages):
            held = self._held[number]
            try:
                if held is not None:
                    held += chunk
                out = _inflate(stage, chunk, room)
            except zlib.error:
                if held is None:
                    raise
                stage = self._stages[number] = zlib.decompressobj(-zlib.MAX_WBITS)
                out = _inflate(stage, bytes(held), room)
                held = None
            if held is not None and out:
                held = None  # the header was read: no second try
            self._held[number] = held
            if stage.unconsumed_tail:
                raise TooLargeError(f"the decoded body exceeds {self._limit} bytes")
            chunk = out
        self._out += len(chunk)
        if self._out > self._limit:
            raise TooLargeError(f"the decoded body exceeds {self._limit} bytes")
        return chunk


def _inflate(stage: zlib._Decompress, data: bytes, max_length: int) -> bytes:
    """``stage.decompress(data, max_length)``, asked for in pieces of at most :data:`PIECE_BYTES`.

    zlib lets go of the GIL while it inflates, not while it assembles one output: a large output
    assembled whole held the event loop (0.15 s for 256 MiB on this machine), its pieces joined do not.
    """
    pieces = []
    while True:
        size = min(max_length, PIECE_BYTES)
        piece = stage.decompress(data, size)
        pieces.append(piece)
        max_length -= len(piece)
        if len(piece) < size or not max_length:
            return b"".join(pieces)
        data = stage.unconsumed_tail


def decoded(body: bytes, content_encoding: str, limit: int) -> bytes | None:
    """``body`` without its content codings; None when it cannot be decoded (or exceeds ``limit``)."""
    try:
        return bounded(body, content_encoding, limit)
    except TooLargeError:
        return None


def bounded(body: bytes, content_encoding: str, limit: int) -> bytes | None:
    """``body`` without its content codings; None when it cannot be decoded, :class:`TooLargeError` past ``limit``."""
    applied = codings(content_encoding)
    if applied is None:
        return None
    if not applied:
        return body
    try:
        return Decoder(applied, limit).feed(body)
    except TooLargeError:
        raise
    except zlib.error:
        return None
