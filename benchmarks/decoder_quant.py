"""The quantization section of the decoder benchmark: speed and quality per weight format.

Every level's models stay loaded together so that, for each prompt, every (level, method) pair
runs back to back (interleaved), and a shared machine's drift hits all alike. Quality is the
next-token agreement of each level with the float model, teacher-forced on the float model's own
greedy continuations of the same prompts (decoder/models/quality.py), and the prompts' perplexity.
llama.cpp is an anchor when ``$LLAMA_SERVER`` names its server binary (benchmarks/llamacpp.py).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable

from scipy.stats import binomtest
from tqdm.auto import tqdm

from benchmarks.llamacpp import LlamaServer, server_binary
from benchmarks.runs import Cell, Outcome, controlled_decoder, decode_once
from decoder import ModelDrafter, NgramDrafter, SpeculativeDecoder, check_pair, load_model
from decoder.models.fetch import fetch_preset
from decoder.models.loading import LoadedModel
from decoder.models.quality import Agreement, agreement, chat_prompt_ids
from decoder.record import Mode

LEVELS = ("none", "int8", "int4")


Method = Callable[[str, str], Outcome]


def decoder_method(decoder: SpeculativeDecoder, max_new_tokens: int, mode: Mode | None = None) -> Method:
    def run(prompt: str, workload: str) -> Outcome:
        return decode_once(decoder, prompt, workload, max_new_tokens, mode)

    return run


def llamacpp_method(server: LlamaServer, target: LoadedModel, max_new_tokens: int) -> Method:
    def run(prompt: str, workload: str) -> Outcome:
        text = target.tokenizer.decode(chat_prompt_ids(target, prompt))
        done = server.complete(text, max_new_tokens)
        mode = "speculative" if done.drafted else "plain"
        return Outcome(done.seconds, done.tokens, done.accepted, done.drafted, 0, 0, mode, done.prompt_seconds)

    return run


def level_methods(target_spec: str, draft_spec: str | None, max_new_tokens: int) -> tuple[
    dict[str, LoadedModel], dict[str, dict[str, Method]]
]:  # fmt: skip
    """Per level: the loaded target, and the methods (plain, speculative with the controller) to time."""
    targets: dict[str, LoadedModel] = {}
    methods: dict[str, dict[str, Method]] = {}
    for level in LEVELS:
        target = load_model(target_spec, quantize=level)
        targets[level] = target
        runs: dict[str, Method] = {"plain": decoder_method(SpeculativeDecoder(target), max_new_tokens, "plain")}
        if draft_spec is not None:
            draft = load_model(draft_spec, quantize=level)
            check_pair(target, draft)
            controlled = controlled_decoder(target, ModelDrafter(draft, target.vocab_size))
            runs["model + controller"] = decoder_method(controlled, max_new_tokens)
        runs["ngram + controller"] = decoder_method(controlled_decoder(target, NgramDrafter()), max_new_tokens)
        methods[level] = runs
    return targets, methods


def quantization_section(
    title: str,
    target_spec: str,
    draft_spec: str | None,
    prompts: dict[str, list[str]],
    max_new_tokens: int,
    repeats: int,
) -> str:
    targets, methods = level_methods(target_spec, draft_spec, max_new_tokens)
    anchors = llamacpp_anchors(target_spec, draft_spec, targets["none"], max_new_tokens)
    if anchors:
        methods["llama.cpp"] = {name: method for name, (_, method) in anchors.items()}
    cells: dict[tuple[str, str, str], Cell] = defaultdict(Cell)
    total = sum(len(p) for p in prompts.values()) * repeats * sum(len(m) for m in methods.values())
    try:
        with tqdm(total=total, desc=title, unit="run") as bar:
            for workload, workload_prompts in prompts.items():
                for prompt in workload_prompts:
                    for _ in range(repeats):
                        for level, runs in methods.items():
                            reference: list[int] | None = None
                            for name, method in runs.items():
                                run = method(prompt, workload)
                                cell = cells[(level, workload, name)]
                                cell.outcomes.append(run)
                                if reference is None:
                                    reference = run.tokens
                                elif run.tokens != reference:
                                    cell.mismatches += 1
                                bar.update()
    finally:
        for server, _ in anchors.values():
            server.close()
    quality = {
        level: agreement(targets["none"], targets[level], [p for ps in prompts.values() for p in ps])
        for level in LEVELS
    }
    note = "" if anchors else f"llama.cpp: skipped ({server_binary()[1]})."
    return render(title, cells, quality, note)


def llamacpp_anchors(target_spec: str, draft_spec: str | None, target: LoadedModel, max_new_tokens: int) -> dict[
    str, tuple[LlamaServer, Method]
]:  # fmt: skip
    binary, _ = server_binary()
    if binary is None:
        return {}
    target_gguf = fetch_preset(target_spec)
    anchors: dict[str, tuple[LlamaServer, Method]] = {}
    plain = LlamaServer(binary, target_gguf, None)
    anchors["plain"] = (plain, llamacpp_method(plain, target, max_new_tokens))
    if draft_spec is not None:
        speculative = LlamaServer(binary, target_gguf, fetch_preset(draft_spec))
        anchors["speculative (draft model)"] = (speculative, llamacpp_method(speculative, target, max_new_tokens))
    return anchors


def render(title: str, cells: dict[tuple[str, str, str], Cell], quality: dict[str, Agreement], note: str) -> str:
    lines = [
        f"### {title}: per weight format",
        "",
        "| weights | workload | method | tokens/s | decode tokens/s | × plain (same weights) | × float plain"
        " | acceptance | γ | modes | greedy = plain |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    by_level: dict[str, list[float]] = defaultdict(list)
    for (level, workload, name), cell in cells.items():
        speed = cell.tokens_per_second()
        plain = cells[(level, workload, "plain")].tokens_per_second()
        float_plain = cells[("none", workload, "plain")].tokens_per_second()
        by_level[f"{level} {name}"].append(speed)
        columns = cell.speculation_columns()
        lines.append(
            f"| {level} | {workload} | {name} | {speed:.2f} | {cell.decode_tokens_per_second():.2f} | "
            f"{speed / plain:.2f} | {speed / float_plain:.2f} | {columns.acceptance} | {columns.gamma} | "
            f"{columns.modes} | {columns.greedy_equals_plain} |"
        )
    lines += ["", "| weights and method | tokens/s, geometric mean over workloads |", "| --- | ---: |"]
    lines += [f"| {name} | {statistics.geometric_mean(v):.2f} |" for name, v in by_level.items()]
    lines += ["", quality_table(quality)]
    if note:
        lines += ["", note]
    return "\n".join(lines)


def quality_table(quality: dict[str, Agreement]) -> str:
    """Agreement with the float model per weight format, with a 95 % Wilson interval, and prompt perplexity.

    The interval treats positions as independent draws; positions of one continuation are not quite
    independent, so read it as a lower bound on the uncertainty.
    """
    lines = [
        "| weights | next-token agreement with float | 95 % interval | positions | prompt perplexity (float → this) |",
        "| --- | ---: | --- | ---: | --- |",
    ]
    for level, q in quality.items():
        interval = binomtest(q.agreed, q.positions).proportion_ci(0.95, method="wilson") if q.positions else None
        lines.append(
            f"| {level} | {q.rate:.3f} | {f'{interval.low:.3f}–{interval.high:.3f}' if interval else ''} | "
            f"{q.positions} | {q.reference_perplexity:.2f} → {q.candidate_perplexity:.2f} |"
        )
    return "\n".join(lines)


def agreement_section(title: str, target_spec: str, prompts: dict[str, list[str]], new_tokens: int) -> str:
    """Next-token agreement of each quantized level with the float model, on every prompt given: no timing."""
    reference = load_model(target_spec, quantize="none")
    flat = [p for ps in prompts.values() for p in ps]
    quality = {"none": agreement(reference, reference, flat[:1], new_tokens)}  # the check that the measure is sound
    for level in LEVELS[1:]:
        quality[level] = agreement(reference, load_model(target_spec, quantize=level), flat, new_tokens)
    dtype = str(reference.model.dtype).removeprefix("torch.")
    return f"### {title}: next-token agreement with float ({dtype})\n\n{quality_table(quality)}"
