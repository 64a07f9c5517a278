"""The sidecar API: ingest from any serving stack, serve the embedded decoder, expose metrics.

The app is :func:`monitor.api.app.create_app`; this package imports nothing on its own, so that its
settings section (:mod:`monitor.api.settings`) loads without FastAPI.
"""
