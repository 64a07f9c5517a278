"""Length buckets, declared once: prompt-length buckets and output-position spans, with their labels.

Prompt buckets split a workload's traffic where drafters are known to behave differently: short
chat turns, a page of context, retrieved documents, whole files. Output spans are the record's own
(:data:`decoder.record.OUTPUT_SPAN_EDGES`): the first 32 output tokens, the next 96, and later.
The store's rollups, the queries, ``/v1/workloads``, the dashboard and the drift test all read
these edges from here.

>>> [prompt_bucket(n) for n in (0, 255, 256, 1023, 1024, 4095, 4096)]
[0, 0, 1, 1, 2, 2, 3]
>>> PROMPT_LABELS, SPAN_LABELS
(('0-256', '256-1024', '1024-4096', '4096+'), ('0-32', '32-128', '128+'))
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Final

from decoder.record import OUTPUT_SPAN_EDGES

__all__ = ["OUTPUT_SPAN_EDGES", "PROMPT_EDGES", "PROMPT_LABELS", "SPAN_LABELS", "bounds", "labels", "prompt_bucket"]

# Prompt tokens where a bucket ends: [0, 256), [256, 1024), [1024, 4096), [4096, ∞).
PROMPT_EDGES: Final = (256, 1024, 4096)


def labels(edges: tuple[int, ...]) -> tuple[str, ...]:
    """``low-high`` per bucket of half-open ranges, the last ``low+``.

    >>> labels((10, 20))
    ('0-10', '10-20', '20+')
    """
    lows = (0, *edges)
    return (*(f"{low}-{high}" for low, high in zip(lows, edges, strict=False)), f"{lows[-1]}+")


def bounds(edges: tuple[int, ...], index: int) -> tuple[int, int | None]:
    """Lower (inclusive) and upper (exclusive, None for the last) edge of bucket ``index``.

    >>> bounds(PROMPT_EDGES, 0), bounds(PROMPT_EDGES, 3)
    ((0, 256), (4096, None))
    """
    lows = (0, *edges)
    return lows[index], edges[index] if index < len(edges) else None


def prompt_bucket(prompt_tokens: int) -> int:
    """The bucket of :data:`PROMPT_EDGES` a prompt of ``prompt_tokens`` tokens falls in."""
    return bisect_right(PROMPT_EDGES, prompt_tokens)


PROMPT_LABELS: Final = labels(PROMPT_EDGES)
SPAN_LABELS: Final = labels(OUTPUT_SPAN_EDGES)
