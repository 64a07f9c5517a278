"""Ingest over HTTP: ``POST /v1/events`` and the adapters ``POST /v1/events/{vllm,llamacpp,sglang}``.

The routes (:mod:`.routes`) and the adapters' bodies (:mod:`.adapters`: a stack's own response plus
what only the caller knows) hand every record to the recorder through the one wire contract of the
shell (:mod:`monitor.api.events`). Like the other sub-rooms, this one imports the shell and the rooms
below, never a sibling; :mod:`monitor.api.app` wires its router.
"""
