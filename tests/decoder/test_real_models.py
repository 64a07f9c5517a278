"""A real pretrained model (smollm2-135m, fetched through the preset path): speculation is lossless."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decoder import LoadedModel, ModelDrafter, NgramDrafter, SpeculativeDecoder, load_model
from monitor.commands.main import main

pytestmark = pytest.mark.models

PROMPTS = [
    "Rename the variable x to total in this code:\ndef f(x):\n    x = x + 1\n    return x\n",
    "Summarise in one sentence: The cat sat on the mat because the mat was warm and the sun was out.",
    "Write a short poem about the sea.",
    "List three prime numbers:",
]


@pytest.fixture(scope="module")
def smollm() -> LoadedModel:
    return load_model("smollm2-135m", progress=False)


@pytest.mark.parametrize("drafter_kind", ["ngram", "model"])
def test_speculative_greedy_equals_plain_greedy(smollm: LoadedModel, drafter_kind: str) -> None:
    drafter = NgramDrafter() if drafter_kind == "ngram" else ModelDrafter(smollm, smollm.vocab_size)
    decoder = SpeculativeDecoder(smollm, drafter, gamma=4)
    for prompt in PROMPTS:
        plain = decoder.generate(prompt, chat=True, max_new_tokens=40, mode="plain")
        speculative = decoder.generate(prompt, chat=True, max_new_tokens=40)
        assert speculative.token_ids == plain.token_ids, prompt
        assert speculative.record.num_spec_steps > 0
    text = "def add(a, b):\n    return a + b\n\n# add a docstring to add\n"
    raw = decoder.generate(text, max_new_tokens=30)
    assert raw.token_ids == decoder.generate(text, max_new_tokens=30, mode="plain").token_ids


def test_model_as_its_own_draft_accepts_nearly_everything(smollm: LoadedModel) -> None:
    decoder = SpeculativeDecoder(smollm, ModelDrafter(smollm, smollm.vocab_size), gamma=4)
    record = decoder.generate(PROMPTS[2], chat=True, max_new_tokens=48).record
    assert record.acceptance_rate is not None and record.acceptance_rate >= 0.95


def test_ngram_drafter_accepts_more_on_copying_prompts(smollm: LoadedModel) -> None:
    decoder = SpeculativeDecoder(smollm, NgramDrafter(), gamma=4)
    copy_prompt = (
        "Fix the typo in this sentence and repeat it: The quick brown fox jumpd over the lazy dog near the river."
    )
    copying = decoder.generate(copy_prompt, chat=True, max_new_tokens=40).record
    prose = decoder.generate(PROMPTS[2], chat=True, max_new_tokens=40).record
    assert copying.mean_acceptance_length is not None and prose.mean_acceptance_length is not None
    assert copying.mean_acceptance_length > 1.5
    assert copying.mean_acceptance_length > prose.mean_acceptance_length


def test_cli_generate_json_plain_and_speculative_agree(capsys: pytest.CaptureFixture[str]) -> None:
    prompt = "Count from one to ten in words:"
    common = ["generate", "--target", "smollm2-135m", "--max-new-tokens", "24", "--chat", "--json", prompt]
    assert main([*common[:3], "--draft", "smollm2-135m", *common[3:]]) == 0
    speculative = json.loads(capsys.readouterr().out)
    assert main([*common[:3], "--plain", *common[3:]]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert speculative["token_ids"] == plain["token_ids"]
    assert speculative["record"]["num_draft_tokens"] > 0
    assert speculative["record"]["num_accepted_tokens"] / speculative["record"]["num_draft_tokens"] >= 0.95
    assert plain["record"]["mode"] == "plain" and plain["record"]["drafter"] == "none"
    assert speculative["text"] == plain["text"]


def test_cli_generate_summary_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--target", "smollm2-135m", "--drafter", "ngram", "--max-new-tokens", "8", "--chat", "Hi"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "accepted" in captured.err and "tokens/s" in captured.err and "[speculative]" in captured.err


def test_cli_reports_bad_model_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--target", "./missing.gguf", "--drafter", "ngram", "hello"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: model path './missing.gguf' does not exist")


def test_cli_evaluate_compares_two_drafters_on_a_real_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same model as its own draft accepts everything; the n-gram drafter beside it, on the same prompts."""
    sample = tmp_path / "sample.jsonl"
    sample.write_text("".join(json.dumps({"workload": "edit", "prompt": p}) + "\n" for p in PROMPTS[:2] * 2))
    argv = ["evaluate", "--target", "smollm2-135m", "--draft", "smollm2-135m", "--drafter", "ngram",
            "--prompts", str(sample), "--max-new-tokens", "8", "--json"]  # fmt: skip
    assert main(argv) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["workload"] == "edit" and (report["learn_prompts"], report["held_out_prompts"]) == (2, 2)
    by_kind = {c["drafter"].split(":")[0].split("@")[0]: c for c in report["candidates"]}
    assert set(by_kind) == {"model", "ngram"}
    assert by_kind["model"]["acceptance"] >= 0.95 and by_kind["model"]["measured_speedup"] > 0
    assert report["recommendation"] in {"plain", *(c["drafter"] for c in report["candidates"])}


def test_cli_evaluate_refuses_a_bad_sample_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sample = tmp_path / "sample.jsonl"
    sample.write_text('{"workload": "edit", "prompt": "x"}\n{"workload": "edit"}\n')
    assert main(["evaluate", "--target", "smollm2-135m", "--drafter", "ngram", "--prompts", str(sample)]) == 1
    assert 'line 2: needs a non-empty "prompt"' in capsys.readouterr().err
