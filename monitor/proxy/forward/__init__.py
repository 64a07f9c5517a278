"""The pass-through: a serving stack's request forwarded, its answer relayed, one record made of it.

With ``proxy.upstream`` set (``draftwatch serve --upstream URL``), the stack's endpoints are served
here and forwarded unchanged: method, headers (the client's own ``Authorization`` included), body,
status, error bodies, and server-sent events event by event as they arrive. Per request one
record is made: the workload from the ``X-Workload`` header (not forwarded), else the body's
``metadata.workload``, else the first matching ``proxy.workload_rules`` rule, else
``proxy.default_workload``; TTFT (first streamed event) and latency measured here; tokens and
speculative counts from the stack's own report, read by the same parser as the adapter endpoints
(:mod:`monitor.ingest.stacks`).

A streamed OpenAI-compatible request is asked for its usage (``stream_options.include_usage``),
and the usage-only event the client did not ask for is taken out of its stream. The monitor never
fails a request: a response whose figures cannot be read is forwarded as is and counted in
``draftwatch_proxy_unrecorded_total``; an answer's record is made once its last byte has gone (the
client never waits for it) and goes through the recorder's queue (which spools when the database is
away), or with ``recorder.spool_before_reply`` is made first and fsync'd to the spool before the
answer's last byte, so that a kill -9 loses no answered request. An unreachable upstream
gives 502 and a silent one 504, both in the
OpenAI error shape and recorded as errors; a client that disconnects mid-stream closes the
upstream request, recorded as an error ("client disconnected"), as does one that leaves before the
answer (the engine's request is cancelled); either way the replica's in-flight count is released.

Every header passes, repeated ones included; compressed bodies pass with their ``Content-Encoding``
and are read from a decoded copy (:mod:`monitor.proxy.encoding`). Any path of the engine that is not
one of draftwatch's own route families is forwarded with any method (``routes.ProxyMiddleware``);
only the generations (``exchange.RECORDED_PATHS``, POSTed) are recorded. A generation whose body is
not one JSON object in UTF-8 is answered 400 here, never sent to a pool its model was not read for.

No request may hold the others: a large body, answer or event is read off the event loop, and only
for its small members (``body.py``, ``sparse.py``); an answer not recorded is passed on as it
arrives, never held; a generation's whole answer past ``proxy.max_body_bytes``, or a stream with an
event past ``proxy.max_event_bytes``, passes on unread and is counted unrecorded.

The request's path, one module a step: ``routes.py`` is the entry (which requests are the engine's,
the forwarded routes, :func:`~monitor.proxy.forward.routes.forward` and the answer, and
``GET /v1/models`` across deployments from ``models.py``); ``body.py`` reads a request's body;
``exchange.py`` is one request and its one record; ``relay.py`` passes a stream on event by event,
reading each with ``events.py``, or an answer through unread; ``sparse.py`` reads a large JSON object
for its small members. This
sub-room stands on the room's top: the routing layer (``routing``, ``pool``), the upstream
connections (``upstream``), content codings (``encoding``), what SGLang is asked for (``asks``) and
the settings.
"""
