"""Drift and latency-regression tests over stored requests, one test per module.

Entry points: :func:`monitor.drift.run.run_drift` (one run, stored) and
:func:`monitor.drift.queries.latest_results` (what the newest run found). Statistics and defaults
are explained in ``docs/statistics.md``.
"""
