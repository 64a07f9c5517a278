"""The two workloads the real rollout tests send: one an n-gram drafter copies, one it finds little to copy in."""

from __future__ import annotations

from typing import Final

LIST: Final = (
    "red green blue yellow orange purple pink brown black white gray silver gold navy teal olive maroon coral ivory "
    "beige cat dog horse cow sheep goat pig duck mouse fox wolf bear lion tiger eagle owl fish frog snake"
)
PROMPTS: Final[dict[str, list[str]]] = {
    # The list three times, then its start: the answer (32 tokens) is the list's next 32 words, copied.
    "copy": [f"{LIST}\n{LIST}\n{LIST}\n{start}" for start in ("red green", "red green blue", "red green blue yellow")],
    "story": [
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Describe a thunderstorm over a mountain village in vivid detail.",
        "Write a letter from a sailor to his sister about a voyage to the south.",
        "Tell a fable about a clever fox and a proud crow.",
    ],
}
