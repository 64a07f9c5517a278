"""When a request stops: end-of-sequence tokens and stop strings, never emitting past either.

A step can emit several tokens at once, so the check looks at all of them and says how many to
keep: up to and including an end-of-sequence token, or up to the token that completes a stop
string. The text shown to the caller ends before the stop string, as in OpenAI's API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class Stopper:
    """Per-request stop state over the growing list of output token ids."""

    def __init__(self, tokenizer: Any, eos_token_ids: set[int], stop_strings: Sequence[str] = ()) -> None:
        if any(not s for s in stop_strings):
            raise ValueError("stop strings must be non-empty")
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.stop_strings = tuple(stop_strings)
        self._longest = max((len(s) for s in self.stop_strings), default=0)
        self._scanned_chars = 0

    def decode(self, output_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(output_ids), skip_special_tokens=True))

    def keep(self, output_ids: Sequence[int], num_new: int) -> int | None:
        """How many of the last ``num_new`` ids to keep if the request stops among them, else ``None``."""
        first = len(output_ids) - num_new
        keep: int | None = None
        for offset, token in enumerate(output_ids[first:]):
            if token in self.eos_token_ids:
                keep = offset + 1
                break
        if self.stop_strings:
            end = first + (keep if keep is not None else num_new)
            text = self.decode(output_ids[:end])
            start = max(0, self._scanned_chars - self._longest + 1)
            if any(s in text[start:] for s in self.stop_strings):
                # Rare: find the first token that completes a stop string.
                for count in range(1, end - first + 1):
                    if self._find(self.decode(output_ids[: first + count])) is not None:
                        return count
            self._scanned_chars = len(text)
        return keep

    def visible_text(self, output_ids: Sequence[int], final: bool) -> str:
        """The caller's text: cut before any stop string; while streaming, hold back what may still change."""
        text = self.decode(output_ids)
        cut = self._find(text)
        if cut is not None:
            return text[:cut]
        if final:
            return text
        # An incomplete UTF-8 sequence decodes as U+FFFD until its last byte arrives.
        text = text.rstrip("\ufffd")
        for length in range(min(self._longest - 1, len(text)), 0, -1):
            if any(s.startswith(text[-length:]) for s in self.stop_strings):
                return text[:-length]
        return text

    def _find(self, text: str) -> int | None:
        hits = [i for i in (text.find(s) for s in self.stop_strings) if i >= 0]
        return min(hits) if hits else None


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends a sequence: the tokenizer's and the generation config's (often a list)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return ids
