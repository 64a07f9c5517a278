"""Decoder speed: draftwatch against plain decoding and transformers' own speculative modes.

One run, one machine, the same prompts; for each prompt the methods run back to back (A B C ...
A B C ...), so that slow drift of a shared machine hits every method alike. Greedy outputs of every
method are checked against plain decoding. Usage:

    python benchmarks/decoder_speed.py            # full: Qwen pair + smollm2/ngram, 5 prompts per workload
    python benchmarks/decoder_speed.py --quick    # under 5 minutes: fewer Qwen prompts
    python benchmarks/decoder_speed.py --quantization   # per weight format (none, int8, int4): speed and agreement
    python benchmarks/decoder_speed.py --portfolio      # the Qwen target: each drafter alone and both as a portfolio

The methods above run with the default weight format of this device (int4 on a CPU, see
docs/quantization.md); ``--quantization`` writes its own section, with llama.cpp as an anchor
when ``$LLAMA_SERVER`` names its server binary.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import write_section
from benchmarks.runs import Cell, Outcome, controlled_decoder, decode_once
from decoder import ModelDrafter, NgramDrafter, SpeculativeDecoder, check_pair, load_model
from decoder.models.loading import LoadedModel
from decoder.models.quality import chat_prompt_ids
from decoder.record import Mode
from decoder.workloads import builtin_workloads, copy_heavy_workloads

logger = logging.getLogger("decoder_speed")


Method = Callable[[list[int], str, str], Outcome]


def hf_method(target: LoadedModel, max_new_tokens: int, **generate_kwargs: Any) -> Method:
    def run(prompt_ids: list[int], prompt: str, workload: str) -> Outcome:
        ids = torch.tensor([prompt_ids])
        started = time.perf_counter()
        with torch.inference_mode():
            out = target.model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, **generate_kwargs)
        return Outcome(time.perf_counter() - started, out[0, len(prompt_ids) :].tolist())

    return run


def draftwatch_method(decoder: SpeculativeDecoder, max_new_tokens: int, mode: Mode | None = None) -> Method:
    def run(prompt_ids: list[int], prompt: str, workload: str) -> Outcome:
        return decode_once(decoder, prompt, workload, max_new_tokens, mode)

    return run


def run_pair(
    label: str,
    methods: dict[str, Method],
    target: LoadedModel,
    prompts: dict[str, list[str]],
    repeats: int,
) -> dict[str, dict[str, Cell]]:
    cells: dict[str, dict[str, Cell]] = defaultdict(lambda: defaultdict(Cell))
    total = sum(len(p) for p in prompts.values()) * repeats * len(methods)
    with tqdm(total=total, desc=label, unit="run") as bar:
        for workload, workload_prompts in prompts.items():
            for prompt in workload_prompts:
                prompt_ids = chat_prompt_ids(target, prompt)
                for _ in range(repeats):
                    reference: list[int] | None = None
                    for name, method in methods.items():  # interleaved: every method on this prompt, in turn
                        outcome = method(prompt_ids, prompt, workload)
                        cell = cells[workload][name]
                        cell.outcomes.append(outcome)
                        if reference is None:
                            reference = outcome.tokens
                        elif outcome.tokens != reference:
                            cell.mismatches += 1
                        bar.set_postfix_str(f"{workload} {name} {len(outcome.tokens) / outcome.seconds:.1f} tok/s")
                        bar.update()
    return cells


def table(label: str, cells: dict[str, dict[str, Cell]], plain: str, assisted: str | None) -> str:
    lines = [
        f"### {label}",
        "",
        f"| workload | method | tokens/s | × {plain} | × assisted | acceptance | mean acc. length | γ | modes"
        " | greedy = plain |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    ratios: dict[str, list[float]] = defaultdict(list)
    for workload, methods in cells.items():
        base = methods[plain].tokens_per_second()
        anchor = methods[assisted].tokens_per_second() if assisted else None
        for name, cell in methods.items():
            speed = cell.tokens_per_second()
            ratios[name].append(speed / base)
            columns = cell.speculation_columns()
            lines.append(
                f"| {workload} | {name} | {speed:.2f} | {speed / base:.2f} | "
                f"{'' if anchor is None else f'{speed / anchor:.2f}'} | {' | '.join(columns)} |"
            )
    lines += ["", f"Geometric mean over workloads, × {plain}: " + ", ".join(
        f"{name} {statistics.geometric_mean(values):.2f}" for name, values in ratios.items()
    )]  # fmt: skip
    return "\n".join(lines)


def qwen_methods(max_new_tokens: int) -> tuple[LoadedModel, dict[str, Method]]:
    target, draft = load_model("qwen-coder-1.5b"), load_model("qwen-coder-0.5b")
    check_pair(target, draft)
    model_drafter = ModelDrafter(draft, target.vocab_size)
    controlled = controlled_decoder(target, model_drafter)
    ngram = controlled_decoder(target, NgramDrafter())
    fixed = SpeculativeDecoder(target, ModelDrafter(draft, target.vocab_size), gamma=4)
    return target, {
        "plain (transformers)": hf_method(target, max_new_tokens),
        "assisted (transformers)": hf_method(target, max_new_tokens, assistant_model=draft.model),
        "prompt lookup (transformers)": hf_method(target, max_new_tokens, prompt_lookup_num_tokens=10),
        "draftwatch plain": draftwatch_method(fixed, max_new_tokens, mode="plain"),
        "draftwatch model + controller": draftwatch_method(controlled, max_new_tokens),
        "draftwatch ngram + controller": draftwatch_method(ngram, max_new_tokens),
        "draftwatch model, fixed γ=4": draftwatch_method(fixed, max_new_tokens),
    }


def portfolio_methods(max_new_tokens: int) -> tuple[LoadedModel, dict[str, Method]]:
    """Plain, each drafter alone under its controller, and both drafters as one portfolio, on the Qwen target."""
    target, draft = load_model("qwen-coder-1.5b"), load_model("qwen-coder-0.5b")
    check_pair(target, draft)
    plain = SpeculativeDecoder(target, None)
    model = controlled_decoder(target, ModelDrafter(draft, target.vocab_size))
    ngram = controlled_decoder(target, NgramDrafter())
    both = controlled_decoder(target, [ModelDrafter(draft, target.vocab_size), NgramDrafter()])
    return target, {
        "draftwatch plain": draftwatch_method(plain, max_new_tokens, mode="plain"),
        "model + controller": draftwatch_method(model, max_new_tokens),
        "ngram + controller": draftwatch_method(ngram, max_new_tokens),
        "portfolio (model, ngram) + controller": draftwatch_method(both, max_new_tokens),
    }


def smollm_methods(max_new_tokens: int) -> tuple[LoadedModel, dict[str, Method]]:
    target = load_model("smollm2-135m")
    ngram = controlled_decoder(target, NgramDrafter())
    fixed = SpeculativeDecoder(target, NgramDrafter(), gamma=4)
    return target, {
        "plain (transformers)": hf_method(target, max_new_tokens),
        "prompt lookup (transformers)": hf_method(target, max_new_tokens, prompt_lookup_num_tokens=10),
        "draftwatch plain": draftwatch_method(fixed, max_new_tokens, mode="plain"),
        "draftwatch ngram + controller": draftwatch_method(ngram, max_new_tokens),
        "draftwatch ngram, fixed γ=4": draftwatch_method(fixed, max_new_tokens),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smollm2 in full, the Qwen pair on 2 workloads x 1 prompt")
    parser.add_argument("--prompts", type=int, default=5, help="prompts per workload (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="default: %(default)s")
    parser.add_argument("--repeats", type=int, default=1, help="repeats per prompt and method (median taken)")
    parser.add_argument("--skip-qwen", action="store_true", help="only the smollm2 + ngram pair")
    parser.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    parser.add_argument("--quantization", action="store_true", help="the per-weight-format section instead")
    parser.add_argument(
        "--portfolio", action="store_true", help="the drafter-portfolio section instead (Qwen target, both drafters)"
    )
    parser.add_argument(
        "--agreement",
        action="store_true",
        help="only next-token agreement of int8 / int4 with float, on every prompt (no timing)",
    )
    parser.add_argument("--agreement-tokens", type=int, default=32, help="continuation length (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("decoder.speculation.speculative").setLevel(logging.INFO)  # the pairs' calibrated costs
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = {w: p[: args.prompts] for w, p in builtin_workloads().items()}
    if args.quantization:
        return quantization_main(args, prompts)
    if args.agreement:
        return agreement_main(args, prompts)
    if args.portfolio:
        return portfolio_main(args, prompts)
    sections = []
    target, methods = smollm_methods(args.max_new_tokens)
    cells = run_pair("smollm2-135m + ngram", methods, target, prompts, args.repeats)
    sections.append(table("smollm2-135m, ngram drafter", cells, "draftwatch plain", None))
    del target, methods
    if not args.skip_qwen:
        qwen_prompts = {w: p[:1] for w, p in prompts.items() if w in ("code", "code-edit")} if args.quick else prompts
        max_new = min(args.max_new_tokens, 48) if args.quick else args.max_new_tokens
        target, methods = qwen_methods(max_new)
        cells = run_pair("qwen-coder-1.5b + 0.5b", methods, target, qwen_prompts, args.repeats)
        sections.append(
            table(
                "qwen-coder-1.5b target, qwen-coder-0.5b draft",
                cells,
                "draftwatch plain",
                "assisted (transformers)",
            )
        )
    body = (
        f"Greedy decoding, chat template, {args.max_new_tokens} new tokens at most"
        f"{' (48 for the Qwen pair in --quick)' if args.quick else ''}, {args.repeats} run(s) per prompt and method, "
        f"methods interleaved per prompt. tokens/s is the median over a workload's prompts. Copy-heavy workloads: "
        f"{', '.join(copy_heavy_workloads())}.\n\n" + "\n\n".join(sections)
    )
    return publish(args, "Decoder speed (benchmarks/decoder_speed.py)", body)


def portfolio_main(args: argparse.Namespace, prompts: dict[str, list[str]]) -> int:
    """Each workload's prompts in turn, so the controllers learn per workload as the sidecar's would."""
    target, methods = portfolio_methods(args.max_new_tokens)
    cells = run_pair("qwen-coder-1.5b portfolio", methods, target, prompts, args.repeats)
    per_workload = len(next(iter(prompts.values())))
    body = (
        f"Greedy decoding, chat template, {args.max_new_tokens} new tokens at most, {per_workload} prompts a workload,"
        f" {args.repeats} run(s) per prompt and method, methods interleaved per prompt; every "
        "controller starts fresh with its pairs timed at start (the portfolio times both). The portfolio holds the "
        "0.5B draft model and the n-gram drafter and picks one per request (decoder/speculation/controller.py).\n\n"
        + table("qwen-coder-1.5b target: each drafter alone, and both", cells, "draftwatch plain", None)
    )
    return publish(args, "Drafter portfolio (benchmarks/decoder_speed.py --portfolio)", body)


def quantization_main(args: argparse.Namespace, prompts: dict[str, list[str]]) -> int:
    from benchmarks.decoder_quant import quantization_section

    max_new = args.max_new_tokens
    sections = [
        quantization_section("smollm2-135m, ngram drafter", "smollm2-135m", None, prompts, max_new, args.repeats)
    ]
    print(sections[-1], flush=True)  # a long run keeps what it measured even if a later part fails
    if not args.skip_qwen:
        quick = ("code", "code-edit", "prose")
        qwen_prompts = {w: p[:1] for w, p in prompts.items() if w in quick} if args.quick else prompts
        sections.append(quantization_section("qwen-coder-1.5b target, qwen-coder-0.5b draft", "qwen-coder-1.5b",
                                             "qwen-coder-0.5b", qwen_prompts, max_new, args.repeats))  # fmt: skip
    body = (
        f"Greedy decoding, chat template, {max_new} new tokens at most, {args.repeats} run(s) per prompt and method, "
        f"torch threads: {torch.get_num_threads()}; every (weights, method) pair interleaved per prompt. Speculative "
        "rows use the controller (its own per weight format). tokens/s counts the whole request; decode tokens/s "
        "leaves out the time to the first token (the prompt's prefill), as llama.cpp's own rate does. Agreement: "
        "teacher-forced next-token agreement with "
        "the float model on its greedy continuations (32 tokens) of the same prompts.\n\n" + "\n\n".join(sections)
    )
    return publish(args, "Decoder speed per weight format (benchmarks/decoder_speed.py --quantization)", body)


def agreement_main(args: argparse.Namespace, prompts: dict[str, list[str]]) -> int:
    from benchmarks.decoder_quant import agreement_section

    targets = ["smollm2-135m"] + ([] if args.skip_qwen else ["qwen-coder-1.5b"])
    sections = [agreement_section(spec, spec, prompts, args.agreement_tokens) for spec in targets]
    body = (
        f"Teacher-forced next-token agreement with the float model on its greedy continuations "
        f"({args.agreement_tokens} tokens) of {sum(len(p) for p in prompts.values())} prompts (chat template). "
        "The 'none' row scores the float model against itself on one prompt: 1.000 says the measure is sound."
        "\n\n" + "\n\n".join(sections)
    )
    return publish(args, "Next-token agreement per weight format (benchmarks/decoder_speed.py --agreement)", body)


def publish(args: argparse.Namespace, title: str, body: str) -> int:
    """Print a section and, unless ``--no-write``, put it into RESULTS.md under ``title``."""
    print(body)
    if not args.no_write:
        write_section(title, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
