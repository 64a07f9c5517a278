"""Fixed, log-spaced histogram buckets: mergeable by addition, quantiles within about 4.5 %.

Bucket ``0`` holds values below :data:`BASE_MS`; bucket ``b >= 1`` holds
``[BASE_MS * 2**((b-1)/8), BASE_MS * 2**(b/8))``; the last bucket also holds everything above. Eight
buckets per doubling bound the relative error of a quantile read at the bucket's geometric middle
by ``2**(1/16) - 1``.

>>> value_bin(1.0), [round(edge, 3) for edge in bin_bounds(value_bin(1.0))]
(54, [0.987, 1.076])
>>> round(quantile({value_bin(10.0): 98, value_bin(500.0): 2}, 0.5), 2)
9.81
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

BASE_MS: Final = 0.01
PER_DOUBLING: Final = 8
NUM_BINS: Final = 1 + PER_DOUBLING * 30  # up to 0.01 ms * 2**30, about three hours

# Metrics stored in rollup_bins. The first two are latency histograms (bins from value_bin); the
# others use the bin as an index: draft position i, number of drafts accepted in a step j, or a
# length bucket.
MS_PER_TOKEN: Final = "ms_per_token"
TTFT_MS: Final = "ttft_ms"
ACCEPTED_AT_POSITION: Final = "accepted_at_position"
ACCEPTANCE_LENGTH: Final = "acceptance_length"
# Acceptance by length (monitor.store.lengths), the bin being the bucket's index: per prompt-length
# bucket, the requests that drafted and their drafted and accepted tokens; per output span, the
# same from the records that report spans (drafted_by_span, accepted_by_span).
PROMPT_DRAFTING: Final = "prompt_drafting"
PROMPT_DRAFTED: Final = "prompt_drafted"
PROMPT_ACCEPTED: Final = "prompt_accepted"
SPAN_DRAFTING: Final = "span_drafting"
SPAN_DRAFTED: Final = "span_drafted"
SPAN_ACCEPTED: Final = "span_accepted"
BY_PROMPT: Final = (PROMPT_DRAFTING, PROMPT_DRAFTED, PROMPT_ACCEPTED)
BY_SPAN: Final = (SPAN_DRAFTING, SPAN_DRAFTED, SPAN_ACCEPTED)
METRICS: Final = (MS_PER_TOKEN, TTFT_MS, ACCEPTED_AT_POSITION, ACCEPTANCE_LENGTH, *BY_PROMPT, *BY_SPAN)


def value_bin(value_ms: float) -> int:
    """The bucket of a non-negative duration in milliseconds."""
    if value_ms < BASE_MS:
        return 0
    index = 1 + math.floor(PER_DOUBLING * math.log2(value_ms / BASE_MS))
    return min(max(index, 1), NUM_BINS - 1)


def bin_bounds(index: int) -> tuple[float, float]:
    """Lower and upper edge of bucket ``index`` (bucket 0 starts at 0)."""
    if index <= 0:
        return 0.0, BASE_MS
    return BASE_MS * 2 ** ((index - 1) / PER_DOUBLING), BASE_MS * 2 ** (index / PER_DOUBLING)


def quantile(counts: Mapping[int, int], q: float) -> float | None:
    """The ``q``-quantile of a histogram, read at the geometric middle of its bucket; None when empty."""
    total = sum(counts.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for index in sorted(counts):
        seen += counts[index]
        if seen >= rank and counts[index] > 0:
            low, high = bin_bounds(index)
            return math.sqrt(low * high) if low > 0 else high / 2
    low, high = bin_bounds(max(counts))
    return math.sqrt(low * high)
