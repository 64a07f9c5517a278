"""Bad input gets an error that says what was wrong and what to do."""

from __future__ import annotations

import logging

import pytest

from decoder import LoadedModel, ModelLoadError, NgramDrafter, SpeculativeDecoder, TokenizerMismatchError, check_pair
from decoder.models.fetch import FetchError, fetch_preset
from decoder.models.loading import load_model
from tests.decoder.tiny import tiny_model, word_tokenizer


def test_empty_prompt(tiny_target: LoadedModel) -> None:
    decoder = SpeculativeDecoder(tiny_target, NgramDrafter())
    with pytest.raises(ValueError, match="prompt is empty"):
        decoder.generate("   ")
    with pytest.raises(ValueError, match="messages are empty"):
        decoder.generate([])


@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_max_new_tokens_must_be_positive(tiny_target: LoadedModel, value: object) -> None:
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        SpeculativeDecoder(tiny_target, None).generate("a b", max_new_tokens=value)


def test_bad_sampling_settings_and_gamma(tiny_target: LoadedModel) -> None:
    decoder = SpeculativeDecoder(tiny_target, NgramDrafter())
    with pytest.raises(ValueError, match="temperature"):
        decoder.generate("a", temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        decoder.generate("a", top_p=0)
    with pytest.raises(ValueError, match="gamma must be in 1..32, got 0"):
        SpeculativeDecoder(tiny_target, NgramDrafter(), gamma=0)
    with pytest.raises(ValueError, match="workload"):
        decoder.generate("a", workload="no spaces please")


def test_prompt_longer_than_context(tiny_target: LoadedModel) -> None:
    with pytest.raises(ValueError, match="exceeds the target's context of 512 tokens"):
        SpeculativeDecoder(tiny_target, None).generate("a " * 500, max_new_tokens=20)


def test_unknown_preset_names_the_presets() -> None:
    with pytest.raises(ModelLoadError, match="unknown model 'smollm-9000'.*smollm2-135m"):
        load_model("smollm-9000")
    with pytest.raises(FetchError, match="unknown preset 'nope'"):
        fetch_preset("nope")


def test_missing_path(tmp_path: object) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model("./no/such/model.gguf")
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model("/definitely/not/here")


def test_not_a_model_directory(tmp_path: object) -> None:
    with pytest.raises(ModelLoadError, match="holds no config.json"):
        load_model(str(tmp_path))


def test_mismatched_tokenizers_name_both_models(tiny_target: LoadedModel) -> None:
    other_words = ["<eos>", *[chr(ord("p") + i) for i in range(15)]]
    other = tiny_model(seed=4, name="other-family", tokenizer=word_tokenizer(other_words))
    expected = r"'tiny-target' and draft 'other-family'.*first differs at token \d+ \(target id"
    with pytest.raises(TokenizerMismatchError, match=expected):
        check_pair(tiny_target, other)
    smaller = tiny_model(seed=4, name="small-vocab", vocab_size=8, tokenizer=word_tokenizer(other_words[:8]))
    with pytest.raises(TokenizerMismatchError, match="vocabulary sizes 16 and 8"):
        check_pair(tiny_target, smaller)


def test_draft_larger_than_target_warns(
    tiny_target: LoadedModel, tiny_draft: LoadedModel, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="decoder.models.loading"):
        check_pair(tiny_draft, tiny_target)  # roles swapped: the "draft" is the bigger one
    assert "is not smaller than target" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="decoder.models.loading"):
        check_pair(tiny_target, tiny_draft)
    assert caplog.text == ""


def test_hub_id_goes_to_the_hub_not_to_the_file_system(monkeypatch: pytest.MonkeyPatch) -> None:
    """``owner/name`` that is not a local path is a hub id: with no hub reachable, say so and what to do."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as caught:
        load_model("HuggingFaceTB/not-a-real-model-for-draftwatch")
    assert "does not exist" not in str(caught.value)
    assert "Without access to a model hub use a preset" in str(caught.value)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model("models/nested/missing")
