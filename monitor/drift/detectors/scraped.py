"""Acceptance drift of scraped series: the interval, not the request, is the unit of evidence.

An engine that only exposes counters (scrape mode) gives one acceptance figure per target, series
and interval: accepted / drafted tokens between two scrapes (or SGLang's gauge at the interval's
end). The test is the per-request one (:class:`~monitor.drift.detectors.acceptance.AcceptanceDrift`: two-sided
Mann–Whitney U, effect = difference of means with a bootstrap interval) over those figures, with
``drift.min_requests`` counting intervals. Intervals that drafted fewer than ``MIN_DRAFTED`` tokens
are left out: a nearly idle interval's rate is mostly noise. What that changes, and the A/A false
alarm rate measured on simulated intervals, is in docs/statistics.md.

>>> rng = np.random.default_rng(3)
>>> ref, cur = rng.normal(0.70, 0.03, 120), rng.normal(0.62, 0.03, 60)
>>> r = IntervalAcceptanceDrift().compare(ref, cur)
>>> round(r.effect, 2), r.metric, r.passes_floor
(-0.07, 'acceptance_rate_intervals', True)
"""

from __future__ import annotations

from typing import Final

import numpy as np
from sqlalchemy.engine import Connection

from monitor.drift.detectors.acceptance import AcceptanceDrift
from monitor.drift.result import DriftResult
from monitor.drift.settings import DriftSettings
from monitor.drift.stats import FloatArray
from monitor.drift.windows import Windows
from monitor.store.scrape import SeriesKey, interval_rates

MIN_DRAFTED: Final = 20


class IntervalAcceptanceDrift(AcceptanceDrift):
    """:class:`AcceptanceDrift` over per-interval acceptance of a scraped series."""

    metric = "acceptance_rate_intervals"


def scraped_tests(conn: Connection, config: DriftSettings, windows: Windows) -> list[DriftResult]:
    """One result per scraped series seen in either window, labelled like the per-request results."""
    ref = interval_rates(conn, windows.ref_start, windows.ref_end)
    cur = interval_rates(conn, windows.cur_start, windows.cur_end)
    results = []
    for key in sorted(set(ref) | set(cur)):
        workload, model, drafter, target = key
        test = IntervalAcceptanceDrift(
            floor=config.floor(workload, "acceptance"), min_requests=config.min_requests, n_boot=config.n_boot
        )
        found = test.compare(_rates(ref, key), _rates(cur, key))
        results.append(
            found.replace(
                workload=workload,
                pair=f"{model}/{drafter}@{target}",
                detail={**found.detail, "source": f"scrape:{target}", "unit": "interval"},
                ref_start=windows.ref_start,
                ref_end=windows.ref_end,
                cur_start=windows.cur_start,
                cur_end=windows.cur_end,
            )
        )
    return results


def _rates(found: dict[SeriesKey, list[tuple[float, int | None]]], key: SeriesKey) -> FloatArray:
    # A gauge has no token count and is kept; a counter's interval needs MIN_DRAFTED tokens.
    kept = [rate for rate, drafted in found.get(key, []) if drafted is None or drafted >= MIN_DRAFTED]
    return np.array(kept, dtype=float)
