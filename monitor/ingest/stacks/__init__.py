"""Parsers of the serving stacks' own responses: vLLM, llama.cpp and SGLang, one module each.

Each parser is a pure function from one response (a non-streamed body, or the final chunk of a
stream) and what the caller knows of the deployment (``speculative``: whether it runs speculative
decoding, ``None`` to infer it from the response; ``num_speculative_tokens``: its draft length, if
known) to a :class:`StackReport`. The adapter endpoints (:mod:`monitor.api.ingest.adapters`) call them
with a posted response; a proxy calls them with the upstream's response and its own timings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

from monitor.ingest.stacks.llamacpp import LlamacppResponse, parse_llamacpp
from monitor.ingest.stacks.report import Problem, Stack, StackError, StackReport, reported
from monitor.ingest.stacks.sglang import SglangResponse, parse_sglang
from monitor.ingest.stacks.vllm import VllmResponse, parse_vllm

__all__ = [
    "PARSERS",
    "STACKS",
    "LlamacppResponse",
    "Parser",
    "Problem",
    "SglangResponse",
    "Stack",
    "StackError",
    "StackReport",
    "VllmResponse",
    "parse_llamacpp",
    "parse_sglang",
    "parse_vllm",
    "reported",
]


class Parser(Protocol):
    def __call__(
        self, response: Mapping[str, Any], *, speculative: bool | None, num_speculative_tokens: int | None = None
    ) -> StackReport: ...


STACKS: Final[tuple[Stack, ...]] = ("vllm", "llamacpp", "sglang")
PARSERS: Final[Mapping[Stack, Parser]] = {"vllm": parse_vllm, "llamacpp": parse_llamacpp, "sglang": parse_sglang}
