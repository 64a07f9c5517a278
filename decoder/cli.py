"""Sub-commands of the decoder: ``draftwatch models ...`` and ``draftwatch generate``.

``draftwatch evaluate`` decodes with the same model arguments (:func:`add_model_arguments`,
:func:`build_decoder`) but lives in monitor/commands/evaluate/, since its remote candidates are
read by the sidecar's stack parsers.

Registering them imports no torch: the model code loads when a command decodes, so ``--help`` and
the sidecar's other commands start fast and run on the base install.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from decoder.candidate import DRAFTER_KINDS, Candidate
from decoder.extras import refuse_without
from decoder.models.fetch import FetchError, fetch_preset, is_fetched, preset_path, remove_preset
from decoder.models.presets import DEFAULT_DRAFT, DEFAULT_TARGET, PRESETS
from decoder.record import RecordError, RequestRecord

if TYPE_CHECKING:
    from decoder.speculation.speculative import SpeculativeDecoder

logger = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    models = subparsers.add_parser("models", help="list and fetch the offline model presets")
    models_sub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    listing = models_sub.add_parser("list", help="list presets and whether they are in the cache")
    listing.add_argument("--json", action="store_true", help="print a JSON list: name, bytes, fetched, path")
    listing.set_defaults(handler=_models_list)
    fetch = models_sub.add_parser("fetch", help="download, assemble and verify presets into the cache")
    fetch.add_argument("names", nargs="+", metavar="PRESET", choices=sorted(PRESETS),
                       help=f"preset to fetch ({', '.join(sorted(PRESETS))}); several in turn")  # fmt: skip
    fetch.add_argument("--force", action="store_true", help="delete the cached copy and fetch it again")
    fetch.set_defaults(handler=_models_fetch)

    generate = subparsers.add_parser(
        "generate",
        help="decode one prompt speculatively and print its text and record",
        description="Decode PROMPT with the target, drafting with --draft (a model) or --drafter ngram, "
        "and print the text plus a one-line summary of what speculation did. With several drafters, the "
        "first one named drafts (a single request has no controller to choose).",
    )
    add_model_arguments(generate)
    generate.add_argument("prompt", metavar="PROMPT", help="the prompt text (with --chat: the user message)")
    generate.add_argument("--workload", default="default", help="workload tag recorded with the request")
    generate.add_argument("--max-new-tokens", type=int, default=128, help="default: %(default)s")
    generate.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    generate.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default: 1.0, off)")
    generate.add_argument("--top-k", type=int, default=0, help="top-k sampling (default: 0, off)")
    generate.add_argument("--seed", type=int, default=None, help="seed for sampling")
    generate.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    generate.add_argument("--chat", action="store_true", help="wrap PROMPT in the model's chat template")
    generate.add_argument("--plain", action="store_true", help="decode with the target alone")
    generate.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, record")
    generate.set_defaults(handler=_generate)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--target, --draft / --drafter and --gamma, shared by every command that decodes.

    Both drafting options repeat, and together they name a portfolio: ``--draft D --drafter ngram``
    holds the draft model D and the n-gram drafter, and the controller picks one per request.
    """
    parser.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"preset ({', '.join(sorted(PRESETS))}), .gguf file, model directory or hub id (default: %(default)s)",
    )
    parser.add_argument(
        "--draft", action="append", default=None, metavar="MODEL",
        help=f"a draft model, same forms as --target; repeatable (default without --drafter: {DEFAULT_DRAFT})",
    )  # fmt: skip
    parser.add_argument(
        "--drafter", action="append", choices=DRAFTER_KINDS, default=None,
        help=f"a drafter kind; repeatable. model: the --draft models, or {DEFAULT_DRAFT} without one; "
        "ngram: prompt lookup, no draft model. --draft D --drafter ngram holds both, chosen per request",
    )  # fmt: skip
    parser.add_argument("--gamma", type=int, default=4, help="draft tokens per step (default: %(default)s)")
    parser.add_argument("--ngram-min", type=int, default=1, help="shortest n-gram to look up (default: 1)")
    parser.add_argument("--ngram-max", type=int, default=4, help="longest n-gram to look up (default: 4)")
    parser.add_argument(
        "--quantize",
        choices=["none", "int8", "int4"],
        default=None,
        help="weight-only quantization of target and draft (default: measured per device; int4 on a CPU)",
    )


def build_decoder(
    args: argparse.Namespace, progress: bool = True, plain: bool = False, candidate: Candidate | None = None
) -> SpeculativeDecoder:
    """Load the target and drafters that ``args`` name, and the ``candidate`` drafter a rollout may stage.

    Raises ModelLoadError / FetchError on bad input. Needs the decoder extra: a caller checks
    ``refuse_without(command, "decoder")`` first.
    """
    from decoder.drafters import Drafter, ModelDrafter, NgramDrafter
    from decoder.models.loading import check_pair, load_model
    from decoder.speculation.speculative import SpeculativeDecoder

    quantize = getattr(args, "quantize", None)
    target = load_model(args.target, progress=progress, quantize=quantize)
    if plain:
        return SpeculativeDecoder(target, None, gamma=args.gamma)

    loaded = {args.target: target}  # a model named twice (the target as draft, a candidate's draft) loads once

    def drafter(spec: str | None, ngram: tuple[int, int]) -> Drafter:
        """The n-gram drafter (``spec`` None) of ``ngram``'s sizes, or the draft model ``spec``."""
        if spec is None:
            return NgramDrafter(min_n=ngram[0], max_n=ngram[1])
        if spec not in loaded:
            loaded[spec] = load_model(spec, progress=progress, quantize=quantize)
        check_pair(target, loaded[spec])
        return ModelDrafter(loaded[spec], target_vocab_size=target.vocab_size)

    drafters = [drafter(spec, (args.ngram_min, args.ngram_max)) for _, spec in drafter_choices(args)]
    staged = None if candidate is None else drafter(candidate.model, (candidate.ngram_min, candidate.ngram_max))
    return SpeculativeDecoder(target, drafters, gamma=args.gamma, candidate=staged)


def drafter_choices(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """The drafters that --draft and --drafter name, in order: ``("model", spec)`` or ``("ngram", None)``.

    >>> parser = argparse.ArgumentParser()
    >>> add_model_arguments(parser)
    >>> drafter_choices(parser.parse_args([]))
    [('model', 'qwen-coder-0.5b')]
    >>> drafter_choices(parser.parse_args(["--drafter", "ngram"]))
    [('ngram', None)]
    >>> drafter_choices(parser.parse_args(["--draft", "smollm2-135m", "--drafter", "ngram"]))
    [('model', 'smollm2-135m'), ('ngram', None)]
    >>> drafter_choices(parser.parse_args(["--drafter", "ngram", "--drafter", "model"]))
    [('model', 'qwen-coder-0.5b'), ('ngram', None)]
    """
    kinds, drafts = args.drafter or [], list(dict.fromkeys(args.draft or []))
    if not drafts and ("model" in kinds or not kinds):
        drafts = [DEFAULT_DRAFT]
    choices: list[tuple[str, str | None]] = [("model", spec) for spec in drafts]
    return [*choices, ("ngram", None)] if "ngram" in kinds else choices


def summary(record: RequestRecord) -> str:
    """One line: what speculation did for this request."""
    rate = record.acceptance_rate
    length = record.mean_acceptance_length
    speed = record.tokens_per_second
    return (
        f"[{record.mode}] accepted {record.num_accepted_tokens}/{record.num_draft_tokens} drafts"
        f" (acceptance {'n/a' if rate is None else f'{rate:.2f}'},"
        f" mean acceptance length {'n/a' if length is None else f'{length:.2f}'}),"
        f" {record.output_tokens} tokens at {0.0 if speed is None else speed:.1f} tokens/s,"
        f" finish {record.finish_reason}"
    )


def _models_list(args: argparse.Namespace) -> int:
    if args.json:
        listing = [
            {
                "name": name,
                "bytes": preset.size,
                "fetched": is_fetched(preset),
                "path": str(preset_path(preset)),
                "description": preset.description,
            }
            for name, preset in sorted(PRESETS.items())
        ]
        print(json.dumps(listing, indent=1))
        return 0
    for name, preset in sorted(PRESETS.items()):
        state = "fetched" if is_fetched(preset) else "not fetched"
        print(f"{name:18} {preset.size / 1e6:7.0f} MB  {state:12} {preset.description}")
        if is_fetched(preset):
            print(f"{'':18} {preset_path(preset)}")
    return 0


def _models_fetch(args: argparse.Namespace) -> int:
    for name in args.names:
        try:
            if args.force:
                remove_preset(name)
            path = fetch_preset(name)
        except FetchError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print(path)
    return 0


def _generate(args: argparse.Namespace) -> int:
    if (refused := refuse_without("draftwatch generate", "decoder")) is not None:
        return refused
    from decoder.models.loading import ModelLoadError

    try:
        decoder = build_decoder(args, plain=args.plain)
        result = decoder.generate(
            args.prompt,
            workload=args.workload,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            chat=args.chat,
            stop=args.stop,
        )
    except (ModelLoadError, FetchError, RecordError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"text": result.text, "token_ids": result.token_ids, "record": result.record.to_dict()}))
    else:
        print(result.text)
        print(summary(result.record), file=sys.stderr)
    return 0
