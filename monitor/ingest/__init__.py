"""Ingest: the recorder (bounded queue, batched writes), its spool for database outages, synthetic records."""
