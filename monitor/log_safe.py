"""Exceptions described for a log without the data that caused them.

An exception's text can quote what it tripped over: PostgreSQL's ``DETAIL: Failing row contains
(...)`` and a COPY's ``CONTEXT`` line carry a whole row, SQLAlchemy appends the statement's
parameters unless the engine hides them, and ``int("x")`` quotes its input. Logs must never carry
request bodies or record fields, so what is logged is the kind of each error, the database's
SQLSTATE code, and where in the code it happened: never the messages.

>>> from sqlalchemy.exc import IntegrityError
>>> describe(IntegrityError("INSERT ...", {"comment": "private"}, ValueError("Failing row contains (private)")))
'sqlalchemy.exc.IntegrityError (ValueError)'
"""

from __future__ import annotations

import traceback


def describe(error: BaseException) -> str:
    """The error's class, the driver's error class a database error wraps, and its SQLSTATE; no text."""
    details: list[str] = []
    original = getattr(error, "orig", None)  # SQLAlchemy's DBAPIError wraps the driver's exception
    if isinstance(original, BaseException):
        details.append(_kind(original))
    sqlstate = getattr(original if isinstance(original, BaseException) else error, "sqlstate", None)
    if isinstance(sqlstate, str):
        details.append(f"SQLSTATE {sqlstate}")
    return f"{_kind(error)} ({', '.join(details)})" if details else _kind(error)


def traceback_text(error: BaseException) -> str:
    """A traceback of ``error`` and the errors it chains (cause or context), with :func:`describe` for each
    in place of its message."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    blocks = [
        "Traceback (most recent call last):\n" + "".join(traceback.format_tb(item.__traceback__)) + describe(item)
        for item in reversed(chain)
    ]
    return "\n\nwhich led to\n\n".join(blocks)


def _kind(error: BaseException) -> str:
    cls = type(error)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
