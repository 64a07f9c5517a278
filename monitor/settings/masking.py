"""What an error message or ``draftwatch config show`` may quote of a setting's value: never a URL's password.

A base URL may carry ``user:password@`` (an upstream behind HTTP Basic auth, a database), and a
value may be any size or depth (a JSON list of routes nested a hundred thousand deep), so a value is
quoted bounded, in length and depth, with the password of every URL in it masked.

>>> mask_urls("http://ada:s3cret@h:8080,http://h:8081")
'http://ada:***@h:8080,http://h:8081'
>>> quoted([{"upstream": "http://ada:s3cret@h:8080"}])
"[{'upstream': 'http://ada:***@h:8080'}]"
"""

from __future__ import annotations

import re
import reprlib
from typing import Any, Final

MASKED: Final = "***"
# The user info of a URL: from the scheme's "//" to the last "@" before the value's next blank, quote or URL.
# It runs over "/", "?" and "#" on purpose: a password with one of them unencoded ends the URL's
# authority early, and must still be masked whole in the message that refuses it. Bounded, so that
# quoting stays cheap whatever the value.
_USERINFO: Final = re.compile(r"(?<=://)((?:(?!://)[^\s'\"\\]){1,1024})@")


def mask_urls(text: str) -> str:
    """``text`` with the password of each URL in it masked (``user:***@``); a user alone may be a token: ``***@``."""
    return _USERINFO.sub(_masked, text)


def _masked(match: re.Match[str]) -> str:
    user, colon, _ = match.group(1).partition(":")
    return f"{user}:{MASKED}@" if colon else f"{MASKED}@"


class _Quote(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 6
        self.maxstring = self.maxother = 200
        self.maxlist = self.maxtuple = self.maxdict = 20

    def repr_str(self, x: str, level: int) -> str:
        # Masked before it is shortened, so that no cut leaves part of a password outside the mask.
        return super().repr_str(mask_urls(x), level)


_QUOTE: Final = _Quote()


def quoted(value: Any) -> str:
    """``repr(value)`` as a message quotes it: URL passwords masked, long strings and deep or long lists cut."""
    return _QUOTE.repr(value)
