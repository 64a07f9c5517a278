"""The store's reads: aggregates over the per-minute rollups, per-request samples, and the figures they return.

The API, the drift run and the dashboard read requests and rollups only through here
(``queries.py``; the dashboard's own views in ``dashboard.py``; the typed results in ``results.py``),
so that a read costs the same over a thousand records as over millions. Nothing here writes. This
sub-room imports the store's schema (models, rollups, bins, lengths), never the writes beside it.
"""
