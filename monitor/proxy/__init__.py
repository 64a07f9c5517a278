"""Proxy mode: the sidecar in a serving stack's request path: pass-through, upstream pools, routing, recording.

The room's top is what the request path stands on: the routing layer (``routing.py``: deployments
by model, the baseline's share or membership, workloads routed to plain; ``pool.py``: replicas by
least outstanding requests, with passive health; ``decide.py``: the routing decision after a drift
run), the wire to the serving stack (``upstream.py``: its HTTP/1.1 connections; ``encoding.py``:
content codings; ``asks.py``: what SGLang is asked for) and the settings. The request path itself,
from the request in to its one record, is the sub-room ``forward/``: it imports the top, never the reverse.
"""
