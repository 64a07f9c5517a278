"""Acceptance drift within a prompt-length bucket: the acceptance test, run on each bucket's requests.

A drafter that suits short prompts can fail long ones, and a workload's overall acceptance hides
it: when a quarter of the traffic has long prompts and their acceptance falls 15 points, the
workload's mean falls under 4, below the acceptance floor. This test splits both windows' per-request
acceptance rates by prompt length (:data:`monitor.store.lengths.PROMPT_EDGES`: under 256 tokens,
256-1,024, 1,024-4,096, 4,096 and more) and compares each bucket on its own, with the acceptance
test's statistic, effect and floor (:class:`monitor.drift.detectors.acceptance.AcceptanceDrift`: Mann–Whitney U,
mean difference with a bootstrap interval, 5 points). One result per bucket (metric
``acceptance_rate[prompt 1024-4096]``), all in the run's Benjamini–Hochberg family, so the
run-wide false-discovery control is the one every other test has.

* A bucket with requests in neither window gives no result; with fewer than ``min_requests`` in
  either, ``insufficient_data``.
* A workload whose requests all lie in one bucket gets no result: that bucket's test would be the
  acceptance test again, on the same requests.
* Within a bucket the comparison is like for like; a shift of the prompt mix between buckets is not
  an acceptance change here (the prompt-length test sees it).

Error rates, measured on simulated windows (``tests/drift/test_acceptance_by_length.py``'s ``one_run``:
200 requests per window, prompt-length shares 0.4/0.3/0.2/0.1 over the four buckets, per-request
acceptance Beta-distributed around bucket means 0.75/0.65/0.55/0.45 with concentration 8; BH at
0.01 over each comparison's bucket tests). Under no change (seeds 0-2,999; 8,832 bucket tests, the
4,096+ bucket being mostly below the minimum) the raw p falls below 0.05 in 4.9 % and below 0.01 in
1.05 % of tests, mean p 0.50 (uniform: 5 %, 1 %, 0.50), and 32 of the 3,000 comparisons (1.1 %)
had a false alarm: the level, as BH promises when nothing changed. The floor adds little at these
sizes (40-80 requests per bucket), where a significant difference is past 5 points anyway. A drop
of the 1,024-4,096 bucket alone (20 % of the requests; seeds 0-199) by 10, 15 and 20 points is
found in 30 %, 78 % and 96 % of comparisons; the workload's acceptance test, seeing a 2-4 point
drop, finds it in 4.5 %, 9.5 % and 18 %. While one bucket drifts, another bucket's false alarm
came in 2 % of comparisons (BH controls the false-discovery rate, not every error).

>>> rng = np.random.default_rng(3)
>>> prompts = rng.choice([100, 500, 2000], 600)
>>> ref = rng.beta(7, 3, 600)
>>> cur = np.where(prompts == 2000, rng.beta(4, 6, 600), rng.beta(7, 3, 600))
>>> found = acceptance_by_length(prompts, ref, prompts, cur)
>>> [(r.metric, r.passes_floor, r.p < 1e-6) for r in found]  # doctest: +NORMALIZE_WHITESPACE
[('acceptance_rate[prompt 0-256]', False, False), ('acceptance_rate[prompt 256-1024]', False, False),
 ('acceptance_rate[prompt 1024-4096]', True, True)]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from monitor.drift.detectors.acceptance import AcceptanceDrift
from monitor.drift.result import DriftResult
from monitor.drift.stats import FloatArray
from monitor.store.lengths import PROMPT_EDGES, PROMPT_LABELS, bounds, prompt_bucket


class AcceptanceByLength(AcceptanceDrift):
    """The acceptance test on the requests of one prompt-length bucket."""

    test = "acceptance_by_length"

    def __init__(self, bucket: int, **settings: Any) -> None:
        if not 0 <= bucket < len(PROMPT_LABELS):
            raise ValueError(f"bucket must be in 0..{len(PROMPT_LABELS) - 1}, got {bucket!r}")
        super().__init__(**settings)
        self.bucket = bucket
        self.metric = f"acceptance_rate[prompt {PROMPT_LABELS[bucket]}]"

    def compare(self, ref: FloatArray, cur: FloatArray) -> DriftResult:
        result = super().compare(ref, cur)
        low, high = bounds(PROMPT_EDGES, self.bucket)
        return result.replace(detail={**result.detail, "prompt_tokens": [low, high]})


def acceptance_by_length(
    ref_prompts: FloatArray, ref_rates: FloatArray, cur_prompts: FloatArray, cur_rates: FloatArray, **settings: Any
) -> list[DriftResult]:
    """One result per prompt-length bucket that holds requests (see the module docstring for which)."""
    ref_buckets = _buckets(ref_prompts)
    cur_buckets = _buckets(cur_prompts)
    ref_rates, cur_rates = np.asarray(ref_rates, dtype=float), np.asarray(cur_rates, dtype=float)
    present = sorted(set(ref_buckets.tolist()) | set(cur_buckets.tolist()))
    if len(present) < 2:
        return []
    return [
        AcceptanceByLength(b, **settings).compare(ref_rates[ref_buckets == b], cur_rates[cur_buckets == b])
        for b in present
    ]


def _buckets(prompts: FloatArray) -> np.ndarray[Any, np.dtype[np.int64]]:
    return np.array([prompt_bucket(int(n)) for n in np.asarray(prompts)], dtype=np.int64)
