"""Drift and latency-regression tests over stored requests: the run, its windows, samples and results.

The tests themselves, one per module, are the sub-room ``detectors/``; only the run imports it.

Entry points: :func:`monitor.drift.run.run_drift` (one run, stored) and
:func:`monitor.drift.queries.latest_results` (what the newest run found). Statistics and defaults
are explained in ``docs/statistics.md``.
"""
