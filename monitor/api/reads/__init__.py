"""What the sidecar shows: per-workload aggregates and series, liveness and readiness, ``/metrics``,
drift results, alerts.

Every route here reads the store (or this process's figures) and writes nothing, except the
operator's answers to an alert (acknowledgement and silences, ``admin`` scope). This sub-room
imports the shell and the rooms below, never a sibling.
"""
