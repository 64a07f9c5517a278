"""The draftwatch callback the LiteLLM proxy loads from its config: ``litellm_settings: callbacks:
["monitor.gateways.litellm_callback.handler"]``, configured by ``DRAFTWATCH_LITELLM_*`` in its environment.

The one module that imports LiteLLM (installed in the proxy's environment, not draftwatch's): its
hooks hand over to :mod:`~monitor.gateways.litellm_gate` (which deployment, which mode),
:mod:`~monitor.gateways.litellm_report` (the adapter's body, the queue) and
:mod:`~monitor.gateways.litellm_stream` (a stream's chunks, timed). No hook can fail a request:
draftwatch away, a response it cannot read, a bug here, the request goes on as it came.

Written against LiteLLM 1.106.12 (scripts/ensure-litellm.sh). A non-streamed answer is reported
from the success hook (LiteLLM's copy of the engine's body). A stream is reported from
``async_post_call_streaming_iterator_hook``, which sees each chunk the client gets: LiteLLM
rebuilds those chunks, and a chunk without choices (the final usage chunk, where vLLM puts its
``metrics`` and llama.cpp its ``timings`` once usage is asked) loses the engine's fields, and its
success hook gets the assembled answer without them. So the hook reads the engine's own chunks: it
puts :class:`~monitor.gateways.litellm_stream.Tapped` in place of the ``completion_stream`` of
LiteLLM's ``CustomStreamWrapper`` (behind the proxy's ``_UpstreamStreamBoundary``), which LiteLLM
reads chunk by chunk; where that structure is not found, it reads the chunks LiteLLM passes (the
figures of a chunk with choices survive) and logs so once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, Mapping
from datetime import datetime
from typing import Any, Final

from litellm.integrations.custom_logger import CustomLogger

from monitor.gateways.litellm_gate import Gate
from monitor.gateways.litellm_link import client
from monitor.gateways.litellm_report import Reporter, report_body
from monitor.gateways.litellm_settings import load_settings
from monitor.gateways.litellm_stream import StreamWatch, Tapped
from monitor.log_safe import describe
from monitor.settings.parsers import ConfigError

log = logging.getLogger(__name__)
# What the pre-call hook leaves in the request's metadata for the other hooks: the workload, why it was diverted, the
# deployment chosen and when the request started.
MARK = "draftwatch"
# LiteLLM's own flag (proxy/common_request_processing.py): the usage chunk it asked for is not passed to the client.
STRIP_USAGE: Final = "_litellm_strip_stream_usage"


class DraftwatchLogger(CustomLogger):
    """Routes in the pre-call hook, reports in the success hook; with settings that do not parse, does neither.

    A bad setting is logged once, as one line, and the gateway serves on without draftwatch: the
    monitor's configuration is no reason to refuse the users' requests.
    """

    def __init__(self, environ: Mapping[str, str]) -> None:
        super().__init__()
        self._tasks: list[asyncio.Task[None]] = []
        self._untapped_logged = False
        try:
            self.settings = load_settings(environ)
        except ConfigError as error:
            log.error("draftwatch LiteLLM integration off: %s", error)
            self.enabled = False
            return
        self.enabled = True
        self.gate = Gate(self.settings)
        self.reporter = Reporter(self.settings.stack, self.settings.queue_size)

    def _start(self) -> None:
        # LiteLLM builds the callback before its event loop runs: the tasks start with the first request.
        if not self._tasks:
            http = client(self.settings)
            self._tasks = [asyncio.create_task(self.gate.refresh(http, self.settings.refresh_s)),
                           asyncio.create_task(self.reporter.run(http))]  # fmt: skip

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any]:
        if not self.enabled:
            return data
        try:
            self._start()
            metadata = data.get("metadata")
            model = data.get("model")
            if not isinstance(metadata, dict) or not isinstance(model, str):
                return data
            headers = (data.get("proxy_server_request") or {}).get("headers") or {}
            workload = self.gate.workload(headers, metadata)
            data["model"], diverted, drafter = self.gate.choose(model, workload)
            metadata[MARK] = {"workload": workload, "diverted": diverted, "drafter": drafter, "model": data["model"],
                              "started": time.time(), "t0": time.perf_counter()}  # fmt: skip
            if data.get("stream") is True and self.gate.declared(data["model"], diverted, drafter) is not None:
                _ask_usage(data)
        except Exception as error:  # never the user's request's failure
            log.error("draftwatch pre-call hook failed (%s): the request goes on unrouted", describe(error))
        return data

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: datetime, end_time: datetime
    ) -> None:
        if not self.enabled:
            return
        try:
            metadata = (kwargs.get("litellm_params") or {}).get("metadata") or {}
            mark = metadata.get(MARK) or {}
            group = (kwargs.get("standard_logging_object") or {}).get("model_group") or metadata.get("model_group")
            declared = (self.gate.declared(group, mark.get("diverted"), mark.get("drafter"))
                        if isinstance(group, str) else None)  # fmt: skip
            if kwargs.get("stream"):
                return  # reported by the streaming hook, from the engine's chunks
            response = _provider_response(kwargs.get("original_response"), response_obj)
            if declared is None or response is None:
                return
            mode, drafter = declared
            workload = mark.get("workload") or self.gate.workload(metadata.get("headers") or {}, metadata)
            self.reporter.offer(report_body(response, workload=workload, mode=mode, drafter=drafter,
                                            started=start_time.timestamp(), ended=end_time.timestamp()))  # fmt: skip
        except Exception as error:
            log.error("draftwatch success hook failed (%s): this response is not reported", describe(error))

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncGenerator[Any, None]:
        """Pass every chunk on as it came; time the engine's chunks and report the answer once the stream ends.

        A stream that fails, or that its client leaves, before it ends is reported as an error, as the proxy
        records one; a stream that ends without a finish reason too.
        """
        watched = self._watch(response, request_data)
        if watched is None:
            async for item in response:
                yield item
            return
        watch = watched
        try:
            async for item in response:
                watch.saw(item, time.perf_counter())
                if not watch.tapped:
                    self._tap(response, watch)
                yield item
        except Exception as error:
            self._report_stream(request_data, watch, f"the upstream's stream failed ({describe(error)})")
            raise
        except BaseException:  # GeneratorExit, CancelledError: the client went away mid-stream
            self._report_stream(request_data, watch, "client disconnected")
            raise
        self._report_stream(request_data, watch, None if watch.finished else "the stream ended before its last chunk")

    def _tap(self, response: Any, watch: StreamWatch) -> None:
        try:
            tapped = _tap(response, watch)
        except Exception:
            tapped = False
        if not tapped and not self._untapped_logged:
            self._untapped_logged = True
            log.warning("draftwatch: LiteLLM's stream wrapper not found (logged once): streams are reported from "
                        "LiteLLM's chunks, which drop the engine's figures from a final usage chunk")  # fmt: skip

    def _watch(self, response: Any, request_data: dict[str, Any]) -> StreamWatch | None:
        """A watch on a stream draftwatch reports, the engine's chunks tapped where LiteLLM's wrapper is found."""
        if not self.enabled:
            return None
        try:
            mark = _mark(request_data)
            if mark is None or self.gate.declared(mark["model"], mark["diverted"], mark["drafter"]) is None:
                return None
            watch = StreamWatch(started=mark["started"], t0=mark["t0"])
            with contextlib.suppress(Exception):
                _tap(response, watch)  # where the stream is open already; else at its first chunk
            return watch
        except Exception as error:
            log.error("draftwatch streaming hook failed (%s): this stream is not reported", describe(error))
            return None

    def _report_stream(self, request_data: dict[str, Any], watch: StreamWatch, error: str | None) -> None:
        try:
            mark = _mark(request_data)
            declared = None if mark is None else self.gate.declared(mark["model"], mark["diverted"], mark["drafter"])
            if mark is None or declared is None:
                return
            mode, drafter = declared
            ended = time.perf_counter()
            if error is None:
                self.reporter.offer(watch.report(workload=mark["workload"], mode=mode, drafter=drafter, ended_t=ended))
            else:
                record = watch.failure(workload=mark["workload"], mode=mode, drafter=drafter, ended_t=ended,
                                       stack=self.settings.stack, model=mark["model"], error=error)  # fmt: skip
                self.reporter.offer(record, "/v1/events")
        except Exception as failure:
            log.error("draftwatch streaming hook failed (%s): this stream is not reported", describe(failure))


def _mark(request_data: Mapping[str, Any]) -> dict[str, Any] | None:
    metadata = request_data.get("metadata")
    mark = metadata.get(MARK) if isinstance(metadata, dict) else None
    return mark if isinstance(mark, dict) and "t0" in mark else None


def _own(obj: Any, name: str, default: Any) -> Any:
    """``obj``'s own attribute: the proxy's boundary hands the names it lacks to its upstream (``__getattr__``)."""
    try:
        return object.__getattribute__(obj, name)
    except AttributeError:
        return default


def _ask_usage(data: dict[str, Any]) -> None:
    """Ask the engine for its usage chunk, which carries its figures; the client gets it only if it asked.

    LiteLLM 1.106.12 asks for it itself where it knows the deployment takes ``stream_options`` (unless
    ``general_settings.always_include_stream_usage`` is false) and strips it from the client's stream with
    its own flag, which is what this does where LiteLLM did not.
    """
    options = data.get("stream_options")
    options = options if isinstance(options, dict) else {}
    if options.get("include_usage") is not True:
        data["stream_options"] = {**options, "include_usage": True}
        data[STRIP_USAGE] = True


def _tap(response: Any, watch: StreamWatch) -> bool:
    """Put a tap on the engine's stream inside LiteLLM's ``CustomStreamWrapper``; False where it is not found (yet).

    LiteLLM 1.106.12 serves a proxied stream as its ``_UpstreamStreamBoundary`` (the upstream in
    ``_source``) around the router's ``FallbackStreamWrapper``, whose ``_async_generator`` reads the
    deployment's ``CustomStreamWrapper`` (its local ``model_response``, there once the generator has
    started: at the first chunk), whose ``completion_stream`` is the engine's chunk stream as the
    OpenAI client parses it. Without the router the deployment's wrapper is the upstream itself.
    """
    wrapper = response
    for _ in range(6):
        own = _own(wrapper, "__dict__", {})
        generator = own.get("_async_generator")
        if generator is not None:  # the router's fallback wrapper: the deployment's stream is in its generator
            frame = getattr(generator, "ag_frame", None)
            wrapper = None if frame is None else frame.f_locals.get("model_response")
        elif "completion_stream" in own:
            break
        else:
            wrapper = _own(wrapper, "_source", None)
    else:
        return False
    stream = wrapper.completion_stream
    if isinstance(stream, Tapped):
        return True
    if stream is not None:
        wrapper.completion_stream = Tapped(stream, watch.saw_raw)
        return True
    make_call = getattr(wrapper, "make_call", None)
    if make_call is None:
        return False

    async def tapped_call(*args: Any, **kwargs: Any) -> Tapped:  # a stream LiteLLM opens on its first read
        return Tapped(await make_call(*args, **kwargs), watch.saw_raw)

    wrapper.make_call = tapped_call
    return True


def _provider_response(original: Any, response_obj: Any) -> dict[str, Any] | None:
    """The stack's JSON object as it answered: LiteLLM's copy of the raw body, else its own response object."""
    if isinstance(original, str):
        try:
            parsed = json.loads(original)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    dumped = response_obj.model_dump() if hasattr(response_obj, "model_dump") else None
    return dumped if isinstance(dumped, dict) else None


handler = DraftwatchLogger(os.environ)
