"""Proxy mode: the sidecar in a serving stack's request path: pass-through, upstream pools, routing, recording."""
