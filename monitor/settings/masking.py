"""What an error message or ``draftwatch config show`` may quote of a setting's value: no URL's secrets.

A base URL may carry ``user:password@`` (an upstream behind HTTP Basic auth, a database) or a key in
its query (``?api_key=...``), and a value may be any size or depth (a JSON list of routes nested a
hundred thousand deep), so a value is quoted bounded, in length and depth, with every URL in it
masked: its user info, and each value of its query and fragment (their keys kept).

>>> mask_urls("http://ada:s3cret@h:8080,http://h:8081")
'http://ada:***@h:8080,http://h:8081'
>>> mask_urls("http://ada:pass word@h:8080/v1?api_key=sk-live-123&x=1#token=abc")
'http://ada:***@h:8080/v1?api_key=***&x=***#token=***'
>>> quoted([{"upstream": "http://ada:s3cret@h:8080?key=sk-1"}])
"[{'upstream': 'http://ada:***@h:8080?key=***'}]"
"""

from __future__ import annotations

import re
import reprlib
from typing import Any, Final

MASKED: Final = "***"
# A URL quoted in a value runs from its "//" to the next URL's scheme (with the comma or blanks before
# it) or the value's end: not to the first blank, quote, "/", "?" or "#", since a password with one of
# them unencoded (the value a refusal quotes is one not yet checked) must still be masked whole, up to
# the last "@". Each is found by one forward search and a look back of a scheme's length, so masking
# stays linear in the value whatever it holds.
_SEPARATOR: Final = "://"
_NEXT_SCHEME: Final = re.compile(r",?\s{0,8}[A-Za-z][A-Za-z0-9+.-]{0,31}\Z")
_SCHEME_LOOK_BACK: Final = 42
_PARAMETER: Final = re.compile(r"[^&;]+")


def mask_urls(text: str) -> str:
    """``text`` with each URL in it masked: ``user:***@`` (a user alone may be a token: ``***@``), ``?key=***``.

    >>> mask_urls("https://ghp_token@h, postgresql://db:p@ss/w?rd@h/d?sslmode=require")
    'https://***@h, postgresql://db:***@h/d?sslmode=***'
    >>> mask_urls("http://h:1/?debug&k=#top"), mask_urls("http://@h:1"), mask_urls("no URL: a@b?c=d")
    ('http://h:1/?***&k=***#***', 'http://@h:1', 'no URL: a@b?c=d')
    """
    pieces: list[str] = []
    done = 0
    start = text.find(_SEPARATOR)
    while start >= 0:
        start += len(_SEPARATOR)
        following = text.find(_SEPARATOR, start)
        end = len(text) if following < 0 else _before_scheme(text, start, following)
        pieces += [text[done:start], _masked(text[start:end])]
        done, start = end, following
    return "".join([*pieces, text[done:]])


def _before_scheme(text: str, start: int, separator: int) -> int:
    """Where the URL that begins at ``start`` ends: before the scheme of the next one (at ``separator``)."""
    look_back = max(start, separator - _SCHEME_LOOK_BACK)
    scheme = _NEXT_SCHEME.search(text, look_back, separator)
    return separator if scheme is None else scheme.start()


def _masked(url: str) -> str:
    """One URL after its ``//``, masked: the user info up to its last ``@``, then each query and fragment value."""
    user_info, at, rest = url.rpartition("@")
    shown = ""
    if user_info:
        user, colon, _ = user_info.partition(":")
        shown = f"{user}:{MASKED}@" if colon else f"{MASKED}@"
    elif at:
        shown = at  # no user info to hide: a refusal says what is wrong with it
    before, hash_, fragment = rest.partition("#")
    location, question, query = before.partition("?")
    return shown + location + question + _masked_values(query) + hash_ + _masked_values(fragment)


def _masked_values(parameters: str) -> str:
    """``key=***`` for each of ``&`` or ``;`` separated parameters; one without ``=`` may be a token alone: ``***``."""
    return _PARAMETER.sub(lambda p: p.group().partition("=")[0] + "=" + MASKED if "=" in p.group() else MASKED,
                          parameters)  # fmt: skip


class _Quote(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 6
        self.maxstring = self.maxother = 200
        self.maxlist = self.maxtuple = self.maxdict = 20

    def repr_str(self, x: str, level: int) -> str:
        # Masked before it is shortened, so that no cut leaves part of a secret outside the mask.
        return super().repr_str(mask_urls(x), level)


_QUOTE: Final = _Quote()


def quoted(value: Any) -> str:
    """``repr(value)`` as a message quotes it: URL secrets masked, long strings and deep or long lists cut."""
    return _QUOTE.repr(value)
