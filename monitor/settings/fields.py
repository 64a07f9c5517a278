"""A setting is declared once, as a field of its room's section: name, parser, default, help.

Its environment variable follows from the name by one rule (:func:`env_name`), never typed by
hand, so a reader who knows either knows the other.

A section is a frozen, keyword-only dataclass; each field made with :func:`setting` carries its
:class:`Spec` in the field's metadata, so the section is at once the typed value the room reads
and the row the settings table (docs/configuration.md) and the resolver walk. Fields without a
spec are the room's own constants, not settings.

>>> from dataclasses import dataclass
>>> from monitor.settings.parsers import parse_int
>>> @dataclass(frozen=True, kw_only=True)
... class Batch:
...     size: int = setting("batch.size", parse_int(1), 100, "records per batch")
>>> resolve(Batch, lambda spec: (spec.env, "7") if spec.env == "DRAFTWATCH_BATCH_SIZE" else None, Path("/d"))
Batch(size=7)
>>> resolve(Batch, lambda spec: (spec.env, "0"), Path("/d"))
Traceback (most recent call last):
...
monitor.settings.parsers.ConfigError: DRAFTWATCH_BATCH_SIZE='0': expected an integer >= 1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from monitor.settings.masking import quoted
from monitor.settings.parsers import ConfigError, Parser

_SPEC: Final = "draftwatch.setting"
ENV_PREFIX: Final = "DRAFTWATCH_"
T = TypeVar("T")
# Where a raw value was found for a spec (a label such as the variable's name, and the value), or None.
Lookup = Callable[["Spec"], tuple[str, Any] | None]


def env_name(name: str) -> str:
    """The environment variable of the setting ``name``: the prefix, then the name upper-cased, dots as ``_``.

    >>> env_name("recorder.batch_size"), env_name("data_dir")
    ('DRAFTWATCH_RECORDER_BATCH_SIZE', 'DRAFTWATCH_DATA_DIR')
    """
    return ENV_PREFIX + name.upper().replace(".", "_")


@dataclass(frozen=True, slots=True)
class Spec:
    """One setting: its dotted name (also its place in ``draftwatch.toml``), parser and help."""

    name: str
    parse: Parser
    help: str
    # Secret values (API tokens, webhook secrets) are never quoted in error messages.
    secret: bool = False
    # A default inside the data directory (the database file, the spool), computed at resolution.
    derive: Callable[[Path], Any] | None = None
    # Variables it was read from before it followed the rule: users may still set them, so they are
    # read (after the variable) with a warning that names the variable to set instead.
    renamed_from: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        """Its environment variable (:func:`env_name`)."""
        return env_name(self.name)


def setting(
    name: str,
    parse: Parser,
    default: Any,
    help: str,
    *,
    secret: bool = False,
    derive: Callable[[Path], Any] | None = None,
    renamed_from: tuple[str, ...] = (),
) -> Any:
    """A dataclass field declaring one setting; ``default`` is the value when neither source sets it.

    With ``derive``, the default depends on the data directory and ``default`` must be
    ``dataclasses.MISSING``: the field is then required when the section is built by hand.
    """
    if (derive is None) == (default is dataclasses.MISSING):
        raise ValueError(f"setting {name!r}: give a default or derive=, not both or neither")
    metadata = {_SPEC: Spec(name, parse, help, secret, derive, renamed_from)}
    return dataclasses.field(default=default, metadata=metadata)


def specs(section: type[Any]) -> Iterator[tuple[str, Spec]]:
    """(field name, spec) of each setting of ``section``, in declaration order."""
    for item in dataclasses.fields(section):
        if _SPEC in item.metadata:
            yield item.name, item.metadata[_SPEC]


def resolve(section: type[T], lookup: Lookup, data_dir: Path) -> T:
    """Build ``section`` from the raw values ``lookup`` finds; the rest keep their (derived) defaults."""
    values: dict[str, Any] = {}
    for name, spec in specs(section):
        found = lookup(spec)
        if found is None:
            if spec.derive is not None:
                values[name] = spec.derive(data_dir)
            continue
        source, raw = found
        try:
            values[name] = spec.parse(raw)
        except ValueError as error:
            shown = "'<redacted>'" if spec.secret else quoted(raw)
            raise ConfigError(f"{source}={shown}: {error}") from None
    return section(**values)
