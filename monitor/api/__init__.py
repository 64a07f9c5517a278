"""The sidecar API: ingest from any serving stack, serve the embedded decoder, expose metrics.

The modules here are the HTTP shell: the app (:func:`monitor.api.app.create_app`, which wires the
routers), tokens, errors, limits, the shared state and the record on the wire (:mod:`.events`). Each
other concern is a sub-room: :mod:`.ingest` (ingest over HTTP), :mod:`.decoding` (the embedded
decoder's service) and :mod:`.reads`. This package imports nothing on its own, so that its settings
section (:mod:`monitor.api.settings`) loads without FastAPI.
"""
