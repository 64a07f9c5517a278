"""decoder/causes.py: the style fingerprint and the copy share, their bounds, and the record fields that carry them."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from decoder import LoadedModel, NgramDrafter, SpeculativeDecoder
from decoder.causes import MAX_TEXT_CHARS, copy_share, prompt_text, style_fingerprint
from decoder.record import RecordError, quick_pass
from tests.decoder.test_record import outcome, valid

SYSTEM = {"role": "system", "content": "You are a terse code reviewer."}
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
]


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def prose(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(50)) for _ in range(words))


def test_the_fingerprint_ignores_the_users_text_and_names_the_template() -> None:
    base = style_fingerprint(chat(SYSTEM, user("fix the bug in parse()")))
    assert base is not None and len(base) == 12 and int(base, 16) >= 0
    assert style_fingerprint(chat(SYSTEM, user("something else entirely"))) == base
    assert style_fingerprint(chat(SYSTEM, user([{"type": "text", "text": "as parts"}]))) == base
    changed = {**SYSTEM, "content": "You are a verbose code reviewer."}
    assert style_fingerprint(chat(changed, user("fix the bug in parse()"))) != base
    assert style_fingerprint(chat(user("fix the bug in parse()"))) != base  # no system prompt is a style too
    assert style_fingerprint(chat(SYSTEM, user("a"), {"role": "assistant", "content": "b"}, user("c"))) != base
    assert style_fingerprint(chat(SYSTEM, user("a"), tools=[{"type": "function"}])) != base
    developer = style_fingerprint(chat({"role": "developer", "content": "Be brief."}, user("x")))
    assert developer == style_fingerprint(chat({"role": "developer", "content": "Be brief."}, user("y")))
    # The Responses API: its instructions are the template, the input the user's.
    responses = style_fingerprint({"instructions": "Be brief.", "input": "one"})
    assert responses == style_fingerprint({"instructions": "Be brief.", "input": "two"})
    assert responses != style_fingerprint({"instructions": "Be long.", "input": "one"})
    # A plain completion has no template to name; neither has what is not a request.
    assert style_fingerprint({"prompt": "def f(x):"}) is None
    assert style_fingerprint({"text": "native"}) is None
    assert style_fingerprint(None) is None


def test_the_copy_share_is_near_one_for_a_copy_and_near_zero_otherwise() -> None:
    source = prose(1, 400)
    copied = " ".join(source.split()[100:250])
    assert copy_share(source, copied) == 1.0
    assert copy_share(source, prose(2, 150)) == pytest.approx(0.0, abs=0.02)
    half = copied + " " + prose(3, 150)
    assert copy_share(source, half) == pytest.approx(0.5, abs=0.05)
    # Code copied from the prompt counts, punctuation split off the names.
    code = "def parse(text):\n    return json.loads(text)"
    assert copy_share(f"Fix this:\n{code}\n", f"Here:\n{code}") == pytest.approx(1.0, abs=0.3)
    assert copy_share(source, "too short") is None
    ask = chat(SYSTEM, user(source))
    assert copy_share(prompt_text(ask), copied) == 1.0


def test_the_copy_share_costs_what_its_capped_text_costs_however_long_the_texts() -> None:
    capped = prose(4, MAX_TEXT_CHARS // 8)[:MAX_TEXT_CHARS]
    huge = capped + " " + prose(5, 2_000_000)  # about 14 MB each

    def taken(prompt: str, answer: str) -> float:
        started = time.perf_counter()
        copy_share(prompt, answer)
        return time.perf_counter() - started

    truth = min(taken(capped, capped) for _ in range(3))
    assert min(taken(huge, huge) for _ in range(3)) < 3 * truth + 0.01  # the whole text would take 200 times more
    assert copy_share(huge, huge) == 1.0


POOLS: dict[str, list[Any]] = {
    "replica": [None, "10.0.0.1:8000", "", "r" * 512, "r" * 513, "a\x00b", "\ud800", 5],
    "cached_prompt_tokens": [None, 0, 7, -1, True, 1.0, 2**53, 2**53 + 1, "3"],
    "style_hash": [None, "0123456789ab", "0123456789AB", "0123456789a", "0123456789abc", "0123456789ab\n", 12, ""],
    "prompt_copy_share": [None, 0.0, 0.5, 1.0, 1.5, -0.1, float("nan"), 1, True, "0.5"],
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_the_fields_are_validated_and_the_quick_pass_agrees(name: str) -> None:
    for value in POOLS[name]:
        record = valid(**{name: value})
        rules = outcome(record._check_rules)
        try:
            quick = quick_pass(record)
        except Exception:
            quick = False
        if quick:
            assert rules == ("ok",), (name, value)
        if rules != ("ok",):
            assert rules[:2] == ("RecordError", name), (name, value, rules)
    assert quick_pass(valid(**{name: POOLS[name][1]}))
    with pytest.raises(RecordError, match=name):
        valid(**{name: POOLS[name][4]}).check()


def test_the_embedded_decoder_records_its_figures_from_the_text_in_hand(tiny_target: LoadedModel) -> None:
    decoder = SpeculativeDecoder(tiny_target, NgramDrafter())
    prompt = "a b c d a b c d a b"
    result = decoder.generate(prompt, max_new_tokens=24, seed=1)
    record = result.record
    assert record.style_hash is None  # a plain prompt: no template
    assert record.prompt_copy_share == copy_share(prompt, result.text)
    assert record.replica is None and record.cached_prompt_tokens is None  # no replica, no prefix cache here
