"""The recorder's write path: one batch, one transaction (``writer.py``), in bulk per dialect (``bulk.py``).

A record becomes a ``requests`` row by ``rows.py`` (its columns, and back), and its rollup deltas
are applied in the same transaction, so that the rollups always equal the stored rows. This
sub-room imports the store's schema (models, rollups), never the reads beside it.
"""
