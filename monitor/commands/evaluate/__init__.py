"""``draftwatch evaluate``: candidate drafters on the embedded decoder and on remote servers, one report.

``command.py`` is the sub-command (registered by ``monitor.commands.main``): its arguments, the
prompt sample (a file, the built-in one, or the sidecar's captured one), the embedded candidates and
``--store``. ``servers.py`` measures the remote candidates (a llama.cpp, vLLM or SGLang server with
its draft) over HTTP, with the sidecar's parsers, and gives each its speedup interval and verdict.
"""
