"""Silences: label matchers with a start, an end, an author and a comment.

A matcher is ``{"name": LABEL, "value": V, "regex": false, "equal": true}`` as in Alertmanager
(``regex`` matches the whole label value, ``equal: false`` negates). A silence matches an alert when
every matcher does; while it is active the alert keeps its state but nobody is notified.

>>> m = parse_matchers([{"name": "workload", "value": "code|chat", "regex": True},
...                     {"name": "severity", "value": "info", "equal": False}])
>>> matches(m, {"workload": "chat", "severity": "warning"}), matches(m, {"workload": "chat", "severity": "info"})
(True, False)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, or_, select, update
from sqlalchemy.engine import Connection, Engine

from monitor.alerts.models import SilenceRow

SILENCES = SilenceRow.__table__


@dataclass(frozen=True, slots=True)
class Matcher:
    name: str
    value: str
    regex: bool = False
    equal: bool = True

    def test(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        hit = re.fullmatch(self.value, actual) is not None if self.regex else actual == self.value
        return hit == self.equal

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "regex": self.regex, "equal": self.equal}


@dataclass(frozen=True, slots=True)
class Silence:
    id: int
    matchers: tuple[Matcher, ...]
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str
    created_at: datetime
    expired_at: datetime | None

    def active(self, now: datetime) -> bool:
        return self.expired_at is None and self.starts_at <= now < self.ends_at

    def to_json(self, now: datetime) -> dict[str, Any]:
        return {
            "id": self.id,
            "matchers": [m.to_json() for m in self.matchers],
            "starts_at": self.starts_at.isoformat(),
            "ends_at": self.ends_at.isoformat(),
            "created_by": self.created_by,
            "comment": self.comment,
            "created_at": self.created_at.isoformat(),
            "expired_at": self.expired_at.isoformat() if self.expired_at else None,
            "active": self.active(now),
        }


def parse_matchers(raw: Sequence[Mapping[str, Any]]) -> tuple[Matcher, ...]:
    """Validated matchers; an empty list is refused (it would silence everything)."""
    if not raw:
        raise ValueError("a silence needs at least one matcher")
    out = []
    for number, entry in enumerate(raw, start=1):
        name, value = entry.get("name"), entry.get("value")
        regex, equal = entry.get("regex", False), entry.get("equal", True)
        if not isinstance(name, str) or not name or not isinstance(value, str):
            raise ValueError(f"matcher {number}: name (non-empty) and value must be strings")
        if not isinstance(regex, bool) or not isinstance(equal, bool):
            raise ValueError(f"matcher {number}: regex and equal must be true or false")
        if regex:
            try:
                re.compile(value)
            except re.error as error:
                raise ValueError(f"matcher {number}: invalid regular expression: {error}") from None
        out.append(Matcher(name, value, regex, equal))
    return tuple(out)


def matches(matchers: Sequence[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.test(labels) for m in matchers)


def _silence(row: Any) -> Silence:
    matchers = tuple(Matcher(**m) for m in row.matchers)
    return Silence(
        row.id, matchers, row.starts_at, row.ends_at, row.created_by, row.comment, row.created_at, row.expired_at
    )


def active_silences(conn: Connection, now: datetime) -> list[Silence]:
    s = SilenceRow
    rows = conn.execute(select(SILENCES).where(s.expired_at.is_(None), s.starts_at <= now, s.ends_at > now))
    return [_silence(r) for r in rows]


def is_silenced(silences: Sequence[Silence], labels: Mapping[str, str]) -> bool:
    return any(matches(s.matchers, labels) for s in silences)


def create_silence(
    engine: Engine,
    matchers: Sequence[Mapping[str, Any]],
    starts_at: datetime,
    ends_at: datetime,
    created_by: str,
    comment: str,
    now: datetime,
) -> Silence:
    """Store a silence; raises ValueError for bad matchers or an end not after the start."""
    parsed = parse_matchers(matchers)
    if ends_at <= starts_at:
        raise ValueError("ends_at must be after starts_at")
    if not created_by.strip() or not comment.strip():
        raise ValueError("created_by and comment must not be empty")
    values = {
        "matchers": [m.to_json() for m in parsed],
        "starts_at": starts_at,
        "ends_at": ends_at,
        "created_by": created_by.strip(),
        "comment": comment.strip(),
        "created_at": now,
        "expired_at": None,
    }
    with engine.begin() as conn:
        new_id = conn.execute(insert(SilenceRow).values(**values).returning(SilenceRow.id)).scalar_one()
        return _silence(conn.execute(select(SILENCES).where(SilenceRow.id == new_id)).one())


def list_silences(engine: Engine, now: datetime, *, include_expired: bool = False) -> list[Silence]:
    s = SilenceRow
    query = select(SILENCES).order_by(s.id.desc())
    if not include_expired:
        query = query.where(s.expired_at.is_(None), s.ends_at > now)
    with engine.connect() as conn:
        return [_silence(r) for r in conn.execute(query)]


def expire_silence(engine: Engine, silence_id: int, now: datetime) -> bool:
    """End a silence now (it stays listed as expired); False when it does not exist or already ended."""
    s = SilenceRow
    with engine.begin() as conn:
        result = conn.execute(
            update(s)
            .where(s.id == silence_id, s.expired_at.is_(None), or_(s.ends_at > now, s.starts_at > now))
            .values(expired_at=now)
        )
    return result.rowcount == 1
