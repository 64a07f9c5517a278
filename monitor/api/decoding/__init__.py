"""The embedded decoder's service: ``POST /v1/generate`` and ``POST /v1/chat/completions``.

One decoder worker (:mod:`.worker`) runs the requests in arrival order, each with the mode and
gamma of the sidecar's speculation controller, whose state outlives a restart in the data
directory (:mod:`.controller_state`). Used only when ``serve`` has a ``--target``; without one the
routes answer 503. This sub-room imports the shell and the rooms below, never a sibling.
"""
