"""Label selectors as kubectl takes them (``-l``): requirements joined by commas, all of which must hold.

==================  ====================================================
``key=value``       the label is set to ``value`` (also ``key==value``)
``key!=value``      the label is not ``value`` (or not set at all)
``key``             the label is set
``!key``            the label is not set
``key in (a,b)``    the label is set to one of the values
``key notin (a,b)`` the label is not one of the values (or not set)
==================  ====================================================

::

    matches = parse_selector("team=vision,tier!=dev")
    matches({"team": "vision"})    # True
"""

from __future__ import annotations

import re
from collections.abc import Callable

from trainjob.errors import ValidationError

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^(?P<key>{_KEY})\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)$")
_EQUALITY = re.compile(rf"^(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>{_VALUE})$")
_EXISTS = re.compile(rf"^(?P<not>!)?\s*(?P<key>{_KEY})$")

Labels = dict[str, str]


def _split(selector: str) -> list[str]:
    """Requirements at top-level commas (commas inside ``( )`` belong to a set)."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def parse_selector(selector: str) -> Callable[[Labels], bool]:
    """A predicate on a job's labels; ``ValidationError`` (field ``-l``) naming the part it cannot read."""
    tests: list[Callable[[Labels], bool]] = []
    for raw in _split(selector):
        part = raw.strip()
        if match := _SET.match(part):
            key, values = match["key"], {v.strip() for v in match["values"].split(",") if v.strip()}
            if match["op"] == "in":
                tests.append(lambda labels, k=key, v=values: labels.get(k) in v)
            else:
                tests.append(lambda labels, k=key, v=values: labels.get(k) not in v)
        elif match := _EQUALITY.match(part):
            key, value = match["key"], match["value"]
            if match["op"] == "!=":
                tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif match := _EXISTS.match(part):
            key, negated = match["key"], bool(match["not"])
            tests.append(lambda labels, k=key, n=negated: (k in labels) != n)
        else:
            raise ValidationError(
                "-l", f"cannot read {part!r} in selector {selector!r}; use key=value, key!=value, key, !key, "
                "key in (a,b) or key notin (a,b), joined by commas"
            )
    return lambda labels: all(test(labels) for test in tests)
