"""JSON text as ``json.dumps(value, indent=2)`` writes it, in about half the time (``trainjob list -o json``,
``get -o json``); the local store keeps each job's text so a listing need not write it again::

    indented_json({"kind": "List", "items": []})  # '{\n  "kind": "List",\n  "items": []\n}'
"""

from __future__ import annotations

import json
import math
from json.encoder import encode_basestring_ascii as _escape  # type: ignore[attr-defined]
from typing import Any


class _NotPlainJSON(Exception):
    """A value :func:`indented_json` leaves to :func:`json.dumps` (a subclass of a JSON type, or another type)."""


def indented_json(data: Any) -> str:
    """``json.dumps(data, indent=2)``, character for character, in about half the time.

    ``json.dumps`` with an indent runs the standard library's pure-Python encoder, a generator per nesting level;
    ten thousand jobs' resources (``list -o json``) make megabytes of it. Strings are still escaped by the C
    escaper. Anything but plain ``dict`` (with ``str`` keys), ``list``, ``tuple``, ``str``, ``int``, ``float``,
    ``bool`` and ``None`` is handed to ``json.dumps`` as a whole, so its output and errors stay the same.
    """
    parts: list[str] = []
    append = parts.append

    def encode(value: Any, level: int) -> None:
        kind = type(value)
        if kind is str:
            append(_escape(value))
        elif kind is dict:
            if not value:
                append("{}")
                return
            inner = "\n" + "  " * (level + 1)
            opening = "{"
            for key, item in value.items():
                if type(key) is not str:
                    raise _NotPlainJSON
                append(opening + inner + _escape(key) + ": ")
                opening = ","
                encode(item, level + 1)
            append("\n" + "  " * level + "}")
        elif kind is list or kind is tuple:
            if not value:
                append("[]")
                return
            inner = "\n" + "  " * (level + 1)
            opening = "["
            for item in value:
                append(opening + inner)
                opening = ","
                encode(item, level + 1)
            append("\n" + "  " * level + "]")
        elif value is None:
            append("null")
        elif value is True:
            append("true")
        elif value is False:
            append("false")
        elif kind is int:
            append(int.__repr__(value))
        elif kind is float and math.isfinite(value):
            append(float.__repr__(value))
        else:  # NaN and infinities (as json.dumps spells them), and everything that is not plain JSON
            raise _NotPlainJSON

    try:
        encode(data, 0)
    except (_NotPlainJSON, RecursionError):  # json.dumps says what is wrong with a circular or too deep value
        return json.dumps(data, indent=2)
    return "".join(parts)


def indented_json_list(items: list[str], outer: dict[str, Any], key: str) -> str:
    """``indented_json(outer)`` with ``outer[key]`` the list of the values whose :func:`indented_json` texts are
    ``items``, from the texts (each is indented one level further; JSON text has no newline inside a string)::

        indented_json_list(['{\n  "a": 1\n}'], {"kind": "List", "items": []}, "items")
    """
    if not items:
        return indented_json({**outer, key: []})
    placeholder = "\0"  # a string no text in items is: JSON writes it escaped
    head, tail = indented_json({**outer, key: [placeholder]}).split(_escape(placeholder))
    return head + ",\n".join(items).replace("\n", "\n    ") + tail
