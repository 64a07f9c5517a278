"""The Alembic scripts, installed as ``monitor.store.migrations`` (setup.py); run through monitor.store.migrate."""
