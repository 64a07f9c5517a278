"""llama.cpp's ``llama-server``: ``/completion`` and the OpenAI-compatible endpoints, via ``timings``.

Follows tools/server/server-task.cpp at commit 17f5f8a8 (``result_timings::to_json`` and the
``to_json_*`` of ``server_task_result_cmpl_final``). ``timings.draft_n`` and
``timings.draft_n_accepted`` are written only when the request drafted (``draft_n > 0``), so a
speculative server's request that drafted nothing carries neither: only the caller knows it
ran speculatively. ``timings.prompt_n`` counts the prompt tokens processed, the ``cache_n``
reused from the cache excluded; the whole prompt is ``usage.prompt_tokens`` (OpenAI-compatible)
or ``tokens_evaluated`` (``/completion``). The draft length is ``generation_settings``'
``speculative.n_max`` on ``/completion`` where the build writes it (``--draft-max``). Verification
steps are not reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pydantic import Field

from decoder.record import FinishReason
from monitor.ingest.stacks.report import (
    OPENAI_FINISH,
    Count,
    Gamma,
    Identifier,
    Lenient,
    Millis,
    ModelName,
    PromptDetails,
    Reason,
    StackReport,
    agreed,
    cached_of,
    declared_plain,
    finish,
    required,
    settle_gamma,
    validated,
)

# /completion's stop_type; its OpenAI-compatible endpoints call everything but eos and word "length".
STOP_TYPE: Final[Mapping[str, FinishReason]] = {"eos": "stop", "word": "stop", "limit": "length", "none": "length"}


COUNTS: Final = (
    "llama-server counts the prompt in usage.prompt_tokens (OpenAI-compatible endpoints), tokens_evaluated "
    "(/completion) or timings.cache_n + timings.prompt_n (timings.prompt_n alone leaves the cached tokens out), "
    "the output in usage.completion_tokens, tokens_predicted or timings.predicted_n"
)


class LlamacppTimings(Lenient):
    cache_n: Count | None = None
    prompt_n: Count | None = None
    prompt_ms: Millis | None = None
    predicted_n: Count | None = None
    predicted_ms: Millis | None = None
    draft_n: Count | None = None
    draft_n_accepted: Count | None = None


class LlamacppUsage(Lenient):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    prompt_tokens_details: PromptDetails | None = None


class LlamacppSettings(Lenient):
    n_max: Gamma | None = Field(default=None, validation_alias="speculative.n_max")


class LlamacppChoice(Lenient):
    finish_reason: Reason | None = None


class LlamacppResponse(Lenient):
    """A ``llama-server`` response, or the final chunk of its stream (the one carrying ``timings``)."""

    timings: LlamacppTimings
    id: Identifier | None = None
    model: ModelName | None = None
    usage: LlamacppUsage | None = None
    tokens_evaluated: Count | None = None
    tokens_predicted: Count | None = None
    stop_type: Reason | None = None
    choices: tuple[LlamacppChoice, ...] = ()
    generation_settings: LlamacppSettings | None = None


def parse_llamacpp(
    response: Mapping[str, Any], *, speculative: bool | None, num_speculative_tokens: int | None = None
) -> StackReport:
    """The report of one llama.cpp response; ``speculative`` is the server's mode (``None``: infer it)."""
    body = validated(LlamacppResponse, response)
    t, usage = body.timings, body.usage or LlamacppUsage()
    prompt = _first(usage.prompt_tokens, body.tokens_evaluated, _sum(t.cache_n, t.prompt_n))
    output = _first(usage.completion_tokens, body.tokens_predicted, t.predicted_n)
    prompt, output = required(
        "llamacpp", COUNTS, [(("usage", "prompt_tokens"), prompt), (("usage", "completion_tokens"), output)]
    )
    reported = t.draft_n is not None or t.draft_n_accepted is not None
    if reported:
        if speculative is False:
            raise declared_plain("llamacpp", ("timings", "draft_n"), t.draft_n)
        required(
            "llamacpp",
            "llama-server writes them together",
            [(("timings", "draft_n"), t.draft_n), (("timings", "draft_n_accepted"), t.draft_n_accepted)],
        )
    settings = body.generation_settings or LlamacppSettings()
    speculating = reported or bool(speculative)
    gamma = settle_gamma(
        settings.n_max if speculating else None, num_speculative_tokens, "generation_settings.speculative.n_max"
    )
    return StackReport(
        stack="llamacpp",
        request_id=body.id,
        model=body.model,
        mode="speculative" if speculating else "plain",
        prompt_tokens=prompt,
        output_tokens=output,
        drafted=t.draft_n or 0,
        accepted=t.draft_n_accepted or 0,
        num_speculative_tokens=gamma,
        finish_reason=_finish(body),
        # The prompt's processing time, after which the first token is sampled: TTFT as the server sees it.
        ttft_ms=t.prompt_ms,
        latency_ms=None if t.prompt_ms is None or t.predicted_ms is None else t.prompt_ms + t.predicted_ms,
        # timings.cache_n is the server's own count; the OpenAI-shaped usage repeats it in newer builds.
        cached_prompt_tokens=agreed(
            "llamacpp",
            [
                (("timings", "cache_n"), t.cache_n),
                (("usage", "prompt_tokens_details", "cached_tokens"), cached_of(usage.prompt_tokens_details)),
            ],
        ),
    )


def _finish(body: LlamacppResponse) -> FinishReason | None:
    if body.choices:
        return finish("llamacpp", ("choices", 0, "finish_reason"), body.choices[0].finish_reason, OPENAI_FINISH)
    return finish("llamacpp", ("stop_type",), body.stop_type, STOP_TYPE)


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def _sum(cached: int | None, processed: int | None) -> int | None:
    return None if cached is None or processed is None else cached + processed
