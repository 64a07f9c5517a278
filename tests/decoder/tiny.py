"""Tiny random llama-family models and a word-level tokenizer, built from a config in milliseconds.

Weights are drawn with a large initializer range so that next-token distributions are peaked and
target and draft (different seeds) disagree often: a wrong acceptance rule then shows.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from decoder.models.loading import LoadedModel

WORDS = ["<eos>", *[chr(ord("a") + i) for i in range(15)]]


def word_tokenizer(words: list[str] = WORDS) -> PreTrainedTokenizerFast:
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[1]))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", unk_token=words[1])


def tiny_model(
    seed: int,
    name: str = "tiny",
    vocab_size: int = len(WORDS),
    hidden_size: int = 32,
    layers: int = 2,
    init_range: float = 0.6,
    eos_token_id: int | None = 0,
    tokenizer: PreTrainedTokenizerFast | None = None,
) -> LoadedModel:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=init_range,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).float().eval()
    model.generation_config.eos_token_id = eos_token_id
    model.set_attn_implementation("eager")
    tok = tokenizer if tokenizer is not None else word_tokenizer()
    return LoadedModel(name=name, version=f"seed{seed}", model=model, tokenizer=tok, device=torch.device("cpu"))


def random_prompt(rng: torch.Generator, length: int, low: int = 1) -> str:
    ids = torch.randint(low, len(WORDS), (length,), generator=rng).tolist()
    return " ".join(WORDS[i] for i in ids)


def perturbed_copy(source: LoadedModel, noise: float, seed: int, name: str = "tiny-near-draft") -> LoadedModel:
    """A draft that agrees with ``source`` often but not always: its weights plus Gaussian noise."""
    config = source.model.config
    copy = tiny_model(seed=0, name=name, tokenizer=source.tokenizer, hidden_size=config.hidden_size,
                      layers=config.num_hidden_layers, vocab_size=config.vocab_size)  # fmt: skip
    copy.model.load_state_dict(source.model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in copy.model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * noise)
    copy.version = f"{source.version}+noise{noise}"
    return copy
