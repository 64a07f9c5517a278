"""The Prometheus text exposition format (0.0.4), read into samples: name, labels, value.

Only what scrape mode needs: sample lines, ``# HELP``/``# TYPE`` comments skipped, label values
unescaped, NaN and infinities kept, timestamps ignored. A line that is neither is an error naming
its number (the body is never quoted: a misconfigured target may return anything).

>>> text = '# TYPE x_total counter\\nx_total{model_name="m",position="0"} 12\\ny 3.5e2 1700000000000\\n'
>>> [(s.name, s.labels, s.value) for s in parse(text)]
[('x_total', {'model_name': 'm', 'position': '0'}, 12.0), ('y', {}, 350.0)]
>>> parse('x_total 12\\n<html>')
Traceback (most recent call last):
...
monitor.ingest.scrape.exposition.ExpositionError: line 2 is not a Prometheus sample
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL: Final = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\})')
_UNESCAPE: Final = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class ExpositionError(ValueError):
    """The body is not the Prometheus text format."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    samples = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        sample = _sample(line)
        if sample is None:
            raise ExpositionError(f"line {number} is not a Prometheus sample")
        samples.append(sample)
    return samples


def _sample(line: str) -> Sample | None:
    name = _NAME.match(line)
    if name is None:
        return None
    rest = line[name.end() :]
    labels: dict[str, str] = {}
    if rest.startswith("{"):
        rest = rest[1:]
        if rest.lstrip().startswith("}"):
            rest = rest.lstrip()[1:]
        else:
            while True:
                label = _LABEL.match(rest)
                if label is None:
                    return None
                labels[label.group(1)] = re.sub(r"\\.", lambda m: _UNESCAPE.get(m.group(0), m.group(0)), label.group(2))
                rest = rest[label.end() :]
                if label.group(3) == "}":
                    break
    fields = rest.split()
    if not rest[:1].isspace() or not 1 <= len(fields) <= 2:
        return None
    try:
        value = float(fields[0])  # float() reads NaN, +Inf and -Inf as the format writes them
    except ValueError:
        return None
    return Sample(name.group(0), labels, value)
